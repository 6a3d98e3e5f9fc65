"""NIQE (Mittal, Soundararajan, Bovik, "Making a 'Completely Blind' Image Quality Analyzer", 2013), as BasicSR's
``calculate_niqe`` computes it (MATLAB-compatible: Y of BT.601, rounded; 96x96 blocks without overlap; two scales,
the second from MATLAB's antialiased bicubic ``imresize(0.5)``; the published pristine model). Lower is better.

The pristine model ``data/niqe_pris_params.npz`` (``mu_pris_param`` (1, 36), ``cov_pris_param`` (36, 36),
``gaussian_window`` (7, 7)) is published data: the parameters of the official MATLAB release
(live.ece.utexas.edu/research/quality/niqe_release.zip, ``modelparameters.mat``) as BasicSR ships them in
``basicsr/metrics/niqe_pris_params.npz`` (github.com/XPixelGroup/BasicSR, added in commit a19aac6 "Update v1.0",
2020-07-20; SHA-256 2a7c182a68c9e7f1b2e2e5ec723279d6f65d912b6fcaf37eb2bf03d7367c4296), copied byte for byte.

The block features are computed for all blocks at once (BasicSR loops over blocks) in float64; the local
normalisation and the half-size image are computed in float32 exactly as BasicSR computes them, because NIQE's local
variance turns 1-ulp differences there into differences of up to 0.04 in flat regions. The result equals BasicSR's
within 1e-6 on skimage's photographs (tests/test_metrics_niqe.py holds frozen values made by
scripts/reference/make_metric_fixtures.py running BasicSR itself, on photographs and on frames of an H.264 video).
"""

from __future__ import annotations

import functools
import os

import numpy as np
import torch
from scipy.ndimage import convolve
from scipy.special import gamma

from utils.metrics.registry import MetricError

PARAMS_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "niqe_pris_params.npz")
BLOCK = 96
_GAM = np.arange(0.2, 10.001, 0.001)  # the shape parameters searched, as BasicSR / MATLAB
_R_GAM = np.square(gamma(2 / _GAM)) / (gamma(1 / _GAM) * gamma(3 / _GAM))
_SHIFTS = ((0, 1), (1, 0), (1, 1), (1, -1))  # horizontal, vertical and the two diagonal neighbours


@functools.lru_cache(maxsize=1)
def pristine_model() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(mu (36,), cov (36, 36), gaussian_window (7, 7))`` of the shipped pristine model."""
    with np.load(PARAMS_PATH) as p:
        return p["mu_pris_param"].reshape(-1), p["cov_pris_param"], p["gaussian_window"]


def rgb_to_y(rgb: np.ndarray) -> np.ndarray:
    """(H, W, 3) RGB uint8 -> (H, W) float64 Y of BT.601 in [16, 235], rounded (BasicSR's ``to_y_channel`` and
    MATLAB's ``rgb2ycbcr``, then ``round`` as ``calculate_niqe`` does)."""
    x = rgb.astype(np.float32) / np.float32(255.0)
    y = (np.dot(x, [65.481, 128.553, 24.966]) + 16.0) / 255.0
    return np.round(y.astype(np.float32) * np.float32(255.0)).astype(np.float64)


def _half_weights() -> torch.Tensor:
    """The 8 taps of MATLAB's antialiased bicubic at scale 0.5 (Keys' cubic widened 2x), float32 as BasicSR's
    ``imresize`` computes them (over 10 taps whose outer two are 0, normalised to sum 1)."""
    a = torch.arange(4.5, -5.0, -1.0, dtype=torch.float32).view(1, 10).abs() * 0.5
    near = (1.5 * a ** 3 - 2.5 * a ** 2 + 1) * (a <= 1)
    far = (-0.5 * a ** 3 + 2.5 * a ** 2 - 4 * a + 2) * ((a > 1) * (a <= 2))
    w = 0.5 * (near + far)
    return (w / w.sum(1, keepdim=True))[0, 1:-1].contiguous()


def _half(img: np.ndarray) -> np.ndarray:
    """MATLAB ``imresize(img, 0.5, 'bicubic')`` of an even-sized (H, W) float32 image: the 8 taps at stride 2 over a
    symmetric (edge-repeating) border of 3, rows then columns.

    One float32 ``mv`` per output row and column, as BasicSR's ``imresize``: the bits then match it exactly, which
    matters because NIQE's local variance amplifies 1-ulp differences in flat regions (a float64 resize moved NIQE
    by 5e-4 on skimage's camera).
    """
    w = _half_weights()
    x = torch.from_numpy(np.pad(img, ((3, 3), (0, 0)), mode="symmetric"))
    x = torch.stack([x.narrow(0, 2 * i, 8).t().mv(w) for i in range(img.shape[0] // 2)])
    x = torch.from_numpy(np.pad(x.numpy(), ((0, 0), (3, 3)), mode="symmetric"))
    return torch.stack([x.narrow(1, 2 * j, 8).mv(w) for j in range(img.shape[1] // 2)], 1).numpy()


def _aggd(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Asymmetric generalised Gaussian fit of each row of ``x`` (B, N): ``alpha, beta_left, beta_right``, each (B,)
    (moment matching over the 0.001 grid of shapes, as BasicSR's ``estimate_aggd_param``)."""
    sq = x * x
    neg, pos = x < 0, x > 0
    with np.errstate(invalid="ignore", divide="ignore"):
        left = np.sqrt((sq * neg).sum(1) / neg.sum(1))
        right = np.sqrt((sq * pos).sum(1) / pos.sum(1))
        g = left / right
        rhat = np.abs(x).mean(1) ** 2 / sq.mean(1)
        rnorm = rhat * (g ** 3 + 1) * (g + 1) / (g ** 2 + 1) ** 2
    alpha = _GAM[np.argmin((_R_GAM[None, :] - rnorm[:, None]) ** 2, axis=1)]
    k = np.sqrt(gamma(1 / alpha) / gamma(3 / alpha))
    return alpha, left * k, right * k


def _block_features(blocks: np.ndarray) -> np.ndarray:
    """The 18 NIQE features of each normalised block (B, h, w) -> (B, 18)."""
    flat = blocks.reshape(len(blocks), -1)
    alpha, bl, br = _aggd(flat)
    feats = [alpha, (bl + br) / 2]
    for shift in _SHIFTS:
        prod = flat * np.roll(blocks, shift, axis=(1, 2)).reshape(len(blocks), -1)
        alpha, bl, br = _aggd(prod)
        feats += [alpha, (br - bl) * gamma(2 / alpha) / gamma(1 / alpha), bl, br]
    return np.stack(feats, 1)


def niqe_y(y: np.ndarray) -> float:
    """NIQE of a luma image.

    Args:
        y: (H, W) float in [0, 255], already rounded (:func:`rgb_to_y`), holding at least two 96 x 96 blocks (the
            part past the last whole block is cropped, as BasicSR does).

    Raises:
        MetricError: the image holds fewer than two 96 x 96 blocks.
    """
    mu_p, cov_p, window = pristine_model()
    nh, nw = y.shape[0] // BLOCK, y.shape[1] // BLOCK
    # the distortion model is the covariance of the blocks' features: one block has none (NaN, and the SVD of the
    # distance fails), so two blocks are the minimum
    if nh * nw < 2:
        raise MetricError(f"niqe needs frames holding two {BLOCK}x{BLOCK} blocks (at least {BLOCK}x{2 * BLOCK} or "
                          f"{2 * BLOCK}x{BLOCK} pixels), got {y.shape[0]}x{y.shape[1]}")
    # The local normalisation runs in float32 as BasicSR's does: in flat regions sigma comes from a difference of
    # two large, nearly equal numbers, and float64 there moves NIQE by up to 0.04 (measured on skimage's astronaut).
    img = np.asarray(y, np.float32)[:nh * BLOCK, :nw * BLOCK]
    feats = []
    for scale in (1, 2):
        mu = convolve(img, window, mode="nearest")
        sigma = np.sqrt(np.abs(convolve(np.square(img), window, mode="nearest") - np.square(mu)))
        norm = ((img - mu) / (sigma + 1)).astype(np.float64)
        b = BLOCK // scale
        blocks = norm.reshape(nh, b, nw, b).transpose(2, 0, 1, 3).reshape(nh * nw, b, b)  # BasicSR's order
        feats.append(_block_features(blocks))
        if scale == 1:
            img = (_half(img / np.float32(255.0)).astype(np.float32) * np.float32(255.0))
    feats = np.concatenate(feats, 1)
    mu_d = np.nanmean(feats, 0)
    cov_d = np.cov(feats[~np.isnan(feats).any(1)], rowvar=False)
    diff = mu_p - mu_d
    return float(np.sqrt(diff @ np.linalg.pinv((cov_p + cov_d) / 2) @ diff))


def niqe_rgb(rgb: np.ndarray) -> float:
    """NIQE of an (H, W, 3) uint8 RGB image (on its Y channel, as BasicSR's default ``convert_to='y'``)."""
    return niqe_y(rgb_to_y(rgb))
