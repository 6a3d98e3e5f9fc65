"""Image I/O and the PSNR / SSIM / Y-channel metrics of KAIR and the official VRT test script.

The metric definitions are the reference's, so published numbers stay comparable:

- PSNR and SSIM take images on the [0, 255] scale (uint8 in practice) and compute in float64;
- SSIM is the MATLAB-style one: an 11x11 Gaussian window with sigma 1.5 (``cv2.getGaussianKernel``),
  ``cv2.filter2D`` with its default reflect-101 border, then the *valid* crop ``[5:-5, 5:-5]``; for 3-channel
  images it is the mean of the per-channel values;
- the Y channel is MATLAB's BT.601 ``rgb2ycbcr`` luma, computed from ``uint8 / 255`` and scaled back by 255
  without rounding (values in [16, 235]).

:func:`frame_metrics` does exactly what the validation loop of KAIR and the official test script do to one
output frame: clamp to [0, 1], RGB -> BGR, ``(x * 255).round()`` to uint8, then the four metrics.

Every metric function is pure (no I/O, no global state, inputs are never modified).
"""

from __future__ import annotations

import math
import os

import cv2
import numpy as np
import torch

__all__ = [
    "bgr2ycbcr",
    "calculate_psnr",
    "calculate_ssim",
    "frame_metrics",
    "imread_rgb",
    "imwrite_rgb",
    "rgb2ycbcr",
    "tensor2uint",
]

# MATLAB rgb2ycbcr (BT.601, studio swing) coefficients, rows = output (Y, Cb, Cr), columns = input (R, G, B).
_YCBCR_FROM_RGB = np.array(
    [[65.481, 128.553, 24.966], [-37.797, -74.203, 112.0], [112.0, -93.786, -18.214]], dtype=np.float64
)
_YCBCR_OFFSET = np.array([16.0, 128.0, 128.0], dtype=np.float64)


# ----------------------------------------------------------------------------------------------------- metrics
def _crop_border(img1: np.ndarray, img2: np.ndarray, border: int) -> tuple[np.ndarray, np.ndarray]:
    if img1.shape != img2.shape:
        raise ValueError(f"images must have the same shape, got {img1.shape} and {img2.shape}")
    if border < 0:
        raise ValueError(f"border must be >= 0, got {border}")
    h, w = img1.shape[:2]
    return img1[border:h - border, border:w - border], img2[border:h - border, border:w - border]


def calculate_psnr(img1: np.ndarray, img2: np.ndarray, border: int = 0) -> float:
    """PSNR in dB of two images on the [0, 255] scale.

    Args:
        img1: ``(H, W)`` or ``(H, W, C)``, values in [0, 255] (uint8 or float).
        img2: same shape as ``img1``.
        border: pixels cropped from each spatial edge before the comparison.

    Returns:
        ``20 * log10(255 / sqrt(MSE))`` computed in float64; ``inf`` when the images are equal.
    """
    a, b = _crop_border(img1, img2, border)
    mse = np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2)
    if mse == 0:
        return float("inf")
    return 20.0 * math.log10(255.0 / math.sqrt(mse))


def _ssim_single(img1: np.ndarray, img2: np.ndarray) -> float:
    """MATLAB-style SSIM of two 2-D float64 images on the [0, 255] scale."""
    c1 = (0.01 * 255) ** 2
    c2 = (0.03 * 255) ** 2
    kernel = cv2.getGaussianKernel(11, 1.5)
    window = np.outer(kernel, kernel.transpose())

    def blur(x: np.ndarray) -> np.ndarray:
        return cv2.filter2D(x, -1, window)[5:-5, 5:-5]  # valid part only

    mu1, mu2 = blur(img1), blur(img2)
    mu1_sq, mu2_sq, mu1_mu2 = mu1 ** 2, mu2 ** 2, mu1 * mu2
    sigma1_sq = blur(img1 ** 2) - mu1_sq
    sigma2_sq = blur(img2 ** 2) - mu2_sq
    sigma12 = blur(img1 * img2) - mu1_mu2
    ssim_map = ((2 * mu1_mu2 + c1) * (2 * sigma12 + c2)) / ((mu1_sq + mu2_sq + c1) * (sigma1_sq + sigma2_sq + c2))
    return float(ssim_map.mean())


def calculate_ssim(img1: np.ndarray, img2: np.ndarray, border: int = 0) -> float:
    """MATLAB-style SSIM of two images on the [0, 255] scale (the reference's definition).

    Args:
        img1: ``(H, W)``, ``(H, W, 1)`` or ``(H, W, 3)``, values in [0, 255]; H and W > 10 after cropping.
        img2: same shape as ``img1``.
        border: pixels cropped from each spatial edge before the comparison.

    Returns:
        The mean of the SSIM map (valid region); for 3 channels the mean over channels (order irrelevant).
    """
    a, b = _crop_border(img1, img2, border)
    a, b = a.astype(np.float64), b.astype(np.float64)
    if min(a.shape[:2]) <= 10:
        raise ValueError(f"SSIM needs images larger than 10x10 (after the border crop), got {a.shape}")
    if a.ndim == 2:
        return _ssim_single(a, b)
    if a.ndim == 3 and a.shape[2] == 1:
        return _ssim_single(a[..., 0], b[..., 0])
    if a.ndim == 3 and a.shape[2] == 3:
        return float(np.mean([_ssim_single(a[..., i], b[..., i]) for i in range(3)]))
    raise ValueError(f"SSIM expects (H, W), (H, W, 1) or (H, W, 3) images, got shape {a.shape}")


def _ycbcr(img: np.ndarray, only_y: bool, rgb_order: tuple[int, int, int]) -> np.ndarray:
    in_dtype = img.dtype
    scaled = img if in_dtype == np.uint8 else img * 255.0  # a new array: the input is never modified
    matrix = _YCBCR_FROM_RGB[:, list(rgb_order)]  # columns reordered to the input's channel order
    if only_y:
        out = np.dot(scaled, matrix[0]) / 255.0 + _YCBCR_OFFSET[0]
    else:
        out = np.matmul(scaled, matrix.T) / 255.0 + _YCBCR_OFFSET
    out = out.round() if in_dtype == np.uint8 else out / 255.0
    return out.astype(in_dtype)


def rgb2ycbcr(img: np.ndarray, only_y: bool = True) -> np.ndarray:
    """MATLAB ``rgb2ycbcr`` (BT.601).

    Args:
        img: ``(..., 3)`` RGB, uint8 in [0, 255] or float in [0, 1].
        only_y: return only the Y channel ``(...)`` instead of YCbCr ``(..., 3)``.

    Returns:
        Same dtype and scale as the input: uint8 input gives rounded uint8, float input an unrounded float in
        [16/255, 235/255] (Y).
    """
    return _ycbcr(img, only_y, (0, 1, 2))


def bgr2ycbcr(img: np.ndarray, only_y: bool = True) -> np.ndarray:
    """:func:`rgb2ycbcr` for BGR input (``img`` is ``(..., 3)`` in B, G, R order)."""
    return _ycbcr(img, only_y, (2, 1, 0))


# ----------------------------------------------------------------------------------------------- conversions
def tensor2uint(img: torch.Tensor, bgr: bool = False) -> np.ndarray:
    """Float tensor image to uint8 array, as the reference's validation loop does.

    Args:
        img: ``(C, H, W)`` (C = 1 or 3, RGB order) or ``(H, W)``, float, nominally in [0, 1]; any device.
        bgr: return the channels in B, G, R order (what ``cv2.imwrite`` expects).

    Returns:
        ``(H, W, C)`` (``(H, W)`` for 2-D input) uint8: clamped to [0, 1], then ``(x * 255).round()``.
    """
    arr = img.detach().float().cpu().clamp(0, 1).numpy()
    if arr.ndim == 3:
        if bgr and arr.shape[0] == 3:
            arr = arr[::-1]
        arr = np.transpose(arr, (1, 2, 0))
    elif arr.ndim != 2:
        raise ValueError(f"expected a (C, H, W) or (H, W) tensor, got shape {tuple(img.shape)}")
    return (arr * 255.0).round().astype(np.uint8)


def frame_metrics(output: torch.Tensor, gt: torch.Tensor) -> dict[str, float]:
    """PSNR / SSIM on RGB and on the Y channel of one frame, exactly as KAIR's validation computes them.

    Args:
        output: ``(3, H, W)`` RGB float in [0, 1] (clamped here), or ``(1, H, W)`` grayscale.
        gt: same shape as ``output``.

    Returns:
        ``{'psnr', 'ssim', 'psnr_y', 'ssim_y'}``. Both images are rounded to uint8 first (BGR); Y is
        ``bgr2ycbcr(uint8 / 255) * 255``, unrounded. For grayscale frames the Y values equal the plain ones.
    """
    if output.shape != gt.shape:
        raise ValueError(f"output {tuple(output.shape)} and ground truth {tuple(gt.shape)} differ in shape")
    img = np.squeeze(tensor2uint(output, bgr=True))
    ref = np.squeeze(tensor2uint(gt, bgr=True))
    result = {"psnr": calculate_psnr(img, ref), "ssim": calculate_ssim(img, ref)}
    if img.ndim == 3:
        img_y = bgr2ycbcr(img.astype(np.float32) / 255.0) * 255.0
        ref_y = bgr2ycbcr(ref.astype(np.float32) / 255.0) * 255.0
        result["psnr_y"] = calculate_psnr(img_y, ref_y)
        result["ssim_y"] = calculate_ssim(img_y, ref_y)
    else:
        result["psnr_y"], result["ssim_y"] = result["psnr"], result["ssim"]
    return result


# ------------------------------------------------------------------------------------------------------- I/O
def imread_rgb(path: str) -> np.ndarray:
    """Read an image file as ``(H, W, 3)`` float32 RGB in [0, 1] (8- or 16-bit; grayscale is replicated)."""
    img = cv2.imread(path, cv2.IMREAD_UNCHANGED)
    if img is None:
        raise FileNotFoundError(f"cannot read image {path!r} (missing, unreadable or not an image)")
    scale = 65535.0 if img.dtype == np.uint16 else 255.0
    if img.ndim == 2:
        img = np.repeat(img[..., None], 3, axis=2)
    elif img.shape[2] == 4:
        img = img[..., :3]
    return (img[..., ::-1].astype(np.float32) / scale).copy()


def imwrite_rgb(path: str, img: torch.Tensor | np.ndarray) -> None:
    """Write an RGB image as an 8-bit file (PNG for ``.png``), creating the parent directories.

    Args:
        path: destination file; its extension selects the format.
        img: a ``(3, H, W)`` float tensor in [0, 1], or an ``(H, W, 3)`` array (uint8 in [0, 255] or float in
            [0, 1]); RGB order. Floats are clamped and rounded as in :func:`tensor2uint`.
    """
    if isinstance(img, torch.Tensor):
        arr = tensor2uint(img, bgr=True)
    else:
        if img.ndim != 3 or img.shape[2] != 3:
            raise ValueError(f"expected an (H, W, 3) RGB array, got shape {img.shape}")
        arr = img if img.dtype == np.uint8 else (np.clip(img, 0, 1) * 255.0).round().astype(np.uint8)
        arr = np.ascontiguousarray(arr[..., ::-1])
    parent = os.path.dirname(path)
    if parent:
        os.makedirs(parent, exist_ok=True)
    if not cv2.imwrite(path, arr):
        raise OSError(f"cannot write image {path!r} (unsupported extension or unwritable directory)")
