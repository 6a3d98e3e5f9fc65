"""Degradation operations on whole clips: blur kernels and blur, resizes, noise, JPEG, 8-bit quantisation, and the
BI / BD downsamplings of the VSR benchmarks.

Every function is a pure function of a clip (and, where random, of an ``np.random.Generator``): a clip is a
``(T, H, W, 3)`` RGB array, uint8 (levels 0..255) or float in [0, 1]; a float32 array is returned (float64 for
:func:`bi_downsample` / :func:`bd_downsample`, which compute as the MATLAB scripts do) and the input is never
written to. Per-frame parameters are ``(T,)`` arrays, so one clip can use one value for all frames or a value that
drifts over them. The random draws of a pipeline (which kernel, which sigma, ...) are made by
:mod:`data.degradation_pipeline`; the functions here take the drawn values.

Kernels are ``(k, k)`` float64 arrays summing to 1 (``k`` odd), centred on the middle tap:

- Gaussian ``exp(-q / 2)`` with ``q = x^T S^-1 x`` and ``S = R diag(sx^2, sy^2) R^T`` (``R`` the rotation by
  ``angle``); isotropic when ``sx == sy``;
- generalized Gaussian ``exp(-0.5 q^beta)`` (Real-ESRGAN's form; beta 1 is the Gaussian);
- plateau ``1 / (1 + q^beta)``;
- sinc: the ideal circular low-pass of cut-off ``omega`` (rad/pixel), ``omega J1(omega r) / (2 pi r)``, which
  makes ringing and overshoot.
"""

from __future__ import annotations

import math

import cv2
import numpy as np
from scipy.special import j1

__all__ = ["LUMA", "RESIZE_MODES", "add_gaussian_noise", "add_poisson_noise", "bd_downsample", "bi_downsample",
           "filter_clip", "gaussian_kernel", "generalized_gaussian_kernel", "jpeg_clip", "matlab_resize_matrix",
           "plateau_kernel", "quantize", "resize_clip", "sinc_kernel", "to_float32", "to_uint8"]

RESIZE_MODES = {"area": cv2.INTER_AREA, "bilinear": cv2.INTER_LINEAR, "bicubic": cv2.INTER_CUBIC}
LUMA = np.array([0.299, 0.587, 0.114], np.float32)  # RGB -> grey weights (OpenCV's RGB2GRAY)


# ---------------------------------------------------------------------------------------------------- conversions
def to_float32(clip: np.ndarray) -> np.ndarray:
    """uint8 levels -> float32 in [0, 1]; a float clip is cast (a new C-ordered array either way)."""
    if clip.dtype == np.uint8:
        return clip.astype(np.float32, order="C") / np.float32(255)
    return clip.astype(np.float32, order="C")  # C order: OpenCV writes into frames in place


def to_uint8(clip: np.ndarray) -> np.ndarray:
    """Float in [0, 1] -> uint8 levels: clip, then ``x * 255`` rounded half up (MATLAB's ``im2uint8``)."""
    if clip.dtype == np.uint8:
        return clip.copy()
    return np.floor(np.clip(clip, 0, 1) * 255 + 0.5).astype(np.uint8)


def quantize(clip: np.ndarray) -> np.ndarray:
    """Round to the 8-bit levels (what saving the LQ frames as PNG does): float32 ``to_uint8(clip) / 255``."""
    return to_float32(to_uint8(clip))


# ---------------------------------------------------------------------------------------------------------- kernels
def _grid(size: int) -> tuple[np.ndarray, np.ndarray]:
    if size < 1 or size % 2 == 0:
        raise ValueError(f"kernel size must be odd and positive, got {size}")
    r = np.arange(size, dtype=np.float64) - size // 2
    return np.meshgrid(r, r, indexing="xy")  # x along columns, y along rows


def _quadratic(size: int, sigma_x: float, sigma_y: float, angle: float) -> np.ndarray:
    """``x^T S^-1 x`` on the kernel grid, ``S = R diag(sigma_x^2, sigma_y^2) R^T``."""
    x, y = _grid(size)
    c, s = math.cos(angle), math.sin(angle)
    u, v = c * x + s * y, -s * x + c * y  # coordinates in the kernel's principal axes
    return (u / sigma_x) ** 2 + (v / sigma_y) ** 2


def _normalised(k: np.ndarray) -> np.ndarray:
    return k / k.sum()


def gaussian_kernel(size: int, sigma_x: float, sigma_y: float | None = None, angle: float = 0.0) -> np.ndarray:
    """Anisotropic (isotropic when ``sigma_y`` is None or equal) Gaussian, ``(size, size)`` summing to 1."""
    return _normalised(np.exp(-0.5 * _quadratic(size, sigma_x, sigma_x if sigma_y is None else sigma_y, angle)))


def generalized_gaussian_kernel(size: int, sigma_x: float, sigma_y: float, angle: float, beta: float) -> np.ndarray:
    """``exp(-0.5 q^beta)``: ``beta`` < 1 has heavier tails than a Gaussian, > 1 a flatter top (beta 1: Gaussian)."""
    return _normalised(np.exp(-0.5 * _quadratic(size, sigma_x, sigma_y, angle) ** beta))


def plateau_kernel(size: int, sigma_x: float, sigma_y: float, angle: float, beta: float) -> np.ndarray:
    """``1 / (1 + q^beta)``: a flat top with slowly decaying tails."""
    return _normalised(1.0 / (1.0 + _quadratic(size, sigma_x, sigma_y, angle) ** beta))


def sinc_kernel(size: int, omega: float) -> np.ndarray:
    """The circular ideal low-pass of cut-off ``omega`` in (0, pi] rad/pixel, truncated to ``(size, size)``."""
    x, y = _grid(size)
    r = np.hypot(x, y)
    with np.errstate(invalid="ignore", divide="ignore"):
        k = omega * j1(omega * r) / (2 * np.pi * r)
    k[r == 0] = omega ** 2 / (4 * np.pi)  # the limit at r = 0
    return _normalised(k)


def filter_clip(clip: np.ndarray, kernels: np.ndarray) -> np.ndarray:
    """Correlate every frame with its kernel (reflect-101 border, as OpenCV's default and Real-ESRGAN).

    Args:
        clip: ``(T, H, W, 3)`` uint8 or float.
        kernels: ``(k, k)`` for every frame, or ``(T, k, k)`` one per frame.

    Returns:
        float32 ``(T, H, W, 3)``, not clipped (a sinc kernel overshoots).
    """
    x = to_float32(clip)
    shared = kernels.ndim == 2
    factors = _separable(kernels) if shared else None
    for t in range(x.shape[0]):
        k = kernels if shared else kernels[t]
        sep = factors if shared else _separable(k)
        if sep is not None:  # an axis-aligned Gaussian: two 1-D passes instead of k^2 taps per pixel
            cv2.sepFilter2D(x[t], -1, sep[1], sep[0], dst=x[t], borderType=cv2.BORDER_REFLECT_101)
        else:
            cv2.filter2D(x[t], -1, np.asarray(k, np.float32), dst=x[t], borderType=cv2.BORDER_REFLECT_101)
    return x


def _separable(kernel: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """``(column, row)`` float32 factors when ``kernel`` is their outer product (an axis-aligned Gaussian), else
    None. Elementwise arithmetic only (no SVD), so the factors do not depend on BLAS threads."""
    c = kernel.shape[0] // 2
    centre = kernel[c, c]
    if centre <= 0:
        return None
    col, row = kernel[:, c], kernel[c, :]
    if np.abs(np.outer(col, row) / centre - kernel).max() > 1e-9 * centre:
        return None
    root = math.sqrt(centre)
    return (col / root).astype(np.float32), (row / root).astype(np.float32)


# ---------------------------------------------------------------------------------------------------------- resizes
def resize_clip(clip: np.ndarray, size: tuple[int, int], mode: str) -> np.ndarray:
    """Resize every frame to ``size = (height, width)`` with OpenCV (``area``, ``bilinear`` or ``bicubic``; only
    ``area`` averages when shrinking, the other two sample, as in Real-ESRGAN). float32 ``(T, h, w, 3)``."""
    x = to_float32(clip)
    h, w = size
    if (h, w) == x.shape[1:3]:
        return x
    out = np.empty((x.shape[0], h, w, x.shape[3]), np.float32)
    for t in range(x.shape[0]):
        out[t] = cv2.resize(x[t], (w, h), interpolation=RESIZE_MODES[mode])
    return out


def cubic(x: np.ndarray) -> np.ndarray:
    """Keys' cubic (a = -0.5), MATLAB's ``bicubic``; support [-2, 2]."""
    ax = np.abs(x)
    ax2, ax3 = ax ** 2, ax ** 3
    return ((1.5 * ax3 - 2.5 * ax2 + 1.0) * (ax <= 1)
            + (-0.5 * ax3 + 2.5 * ax2 - 4.0 * ax + 2.0) * ((ax > 1) & (ax <= 2)))


def matlab_resize_matrix(in_len: int, out_len: int, scale: float | None = None,
                         antialias: bool = True) -> np.ndarray:
    """``(out_len, in_len)`` weights of MATLAB ``imresize(..., 'bicubic')`` along one axis at ``scale`` (default
    ``out_len / in_len``): the cubic widened by 1 / scale when shrinking with ``antialias``, weights normalised per
    output pixel, symmetric (mirror) border."""
    scale = out_len / in_len if scale is None else scale
    shrink = scale < 1 and antialias
    width = 4.0 / scale if shrink else 4.0
    u = np.arange(1, out_len + 1, dtype=np.float64) / scale + 0.5 * (1.0 - 1.0 / scale)  # 1-based input position
    left = np.floor(u - width / 2.0)
    taps = int(math.ceil(width)) + 2
    idx = left[:, None] + np.arange(taps)[None, :]
    dist = u[:, None] - idx
    weights = scale * cubic(scale * dist) if shrink else cubic(dist)
    weights /= weights.sum(axis=1, keepdims=True)
    mirror = np.concatenate([np.arange(in_len), np.arange(in_len - 1, -1, -1)])
    cols = mirror[np.mod(idx.astype(np.int64) - 1, 2 * in_len)]
    mat = np.zeros((out_len, in_len), np.float64)
    np.add.at(mat, (np.repeat(np.arange(out_len), taps), cols.ravel()), weights.ravel())
    return mat


def _to_float64(clip: np.ndarray) -> np.ndarray:
    return clip.astype(np.float64, order="C") / 255.0 if clip.dtype == np.uint8 else clip.astype(np.float64, order="C")


def bi_downsample(clip: np.ndarray, scale: int) -> np.ndarray:
    """BI: crop H and W to multiples of ``scale``, then MATLAB ``imresize(x, 1 / scale, 'bicubic')`` frame by frame,
    rows before columns, in float64 (the numbers of ``scripts/data_preparation/degradations.py::bi_degrade``, so
    ``quantize`` of it equals the LQ frames that ``generate_lq.py --degradation bi`` writes). ``(T, H/s, W/s, 3)``."""
    x = _to_float64(clip)
    h, w = x.shape[1] - x.shape[1] % scale, x.shape[2] - x.shape[2] % scale
    rows, cols = matlab_resize_matrix(h, h // scale), matlab_resize_matrix(w, w // scale)
    out = np.empty((x.shape[0], h // scale, w // scale, x.shape[3]), np.float64)
    for t in range(x.shape[0]):
        y = np.tensordot(rows, x[t, :h, :w], axes=(1, 0))
        out[t] = np.moveaxis(np.tensordot(cols, y, axes=(1, 1)), 0, 1)
    return out


def gaussian_kernel_1d(sigma: float = 1.6, size: int | None = None) -> np.ndarray:
    """The 1-D factor of MATLAB ``fspecial('gaussian', size, sigma)`` (size ``ceil(3 sigma) * 2 + 2`` by default,
    the even size of the BD scripts), normalised to sum 1; the 2-D kernel is its outer product."""
    size = int(math.ceil(3 * sigma)) * 2 + 2 if size is None else size
    x = np.arange(size, dtype=np.float64) - (size - 1) / 2.0
    g = np.exp(-(x ** 2) / (2.0 * sigma ** 2))
    return g / g.sum()


def _bd_axis(x: np.ndarray, k: np.ndarray, keep: np.ndarray, axis: int) -> np.ndarray:
    """MATLAB ``imfilter(x, k, 'replicate')`` along ``axis`` evaluated at the positions ``keep`` only: an even kernel
    is anchored at tap ``len(k) // 2`` (0-based), so output ``i`` reads inputs ``i - len//2 + 1 .. i + len//2``."""
    n = x.shape[axis]
    before = (len(k) - 1) // 2
    out = np.zeros_like(np.take(x, keep, axis=axis))
    for j, kj in enumerate(k):
        out += kj * np.take(x, np.clip(keep - before + j, 0, n - 1), axis=axis)
    return out


def bd_downsample(clip: np.ndarray, scale: int, sigma: float = 1.6) -> np.ndarray:
    """BD: crop to multiples of ``scale``, the MATLAB Gaussian (``sigma``, ``ceil(3 sigma) * 2 + 2`` taps, replicate
    border), then every ``scale``-th pixel from ``scale // 2 - 1`` (0-based; ``x(2:4:end-2)`` at x4), in float64
    (the numbers of ``scripts/data_preparation/degradations.py::bd_degrade``). ``(T, H/s, W/s, 3)``."""
    x = _to_float64(clip)
    h, w = x.shape[1] - x.shape[1] % scale, x.shape[2] - x.shape[2] % scale
    k = gaussian_kernel_1d(sigma)
    start = scale // 2 - 1
    x = _bd_axis(x[:, :h, :w], k, np.arange(start, h - scale // 2, scale), axis=1)
    return _bd_axis(x, k, np.arange(start, w - scale // 2, scale), axis=2)


# ------------------------------------------------------------------------------------------------------------ noise
def add_gaussian_noise(clip: np.ndarray, sigma: np.ndarray, gray: bool, rng: np.random.Generator) -> np.ndarray:
    """``clip + sigma_t / 255 * N(0, 1)``, clipped to [0, 1].

    Args:
        clip: ``(T, H, W, 3)``.
        sigma: ``(T,)`` noise std per frame on the [0, 255] scale.
        gray: one noise value for the three channels of a pixel (luminance noise) instead of one per channel.
        rng: the clip's generator.
    """
    x = to_float32(clip)
    t, h, w, c = x.shape
    noise = rng.standard_normal((t, h, w, 1 if gray else c), dtype=np.float32)
    noise *= (np.asarray(sigma, np.float32) / np.float32(255))[:, None, None, None]
    x += noise
    return np.clip(x, 0, 1, out=x)


def add_poisson_noise(clip: np.ndarray, scale: np.ndarray, gray: bool, rng: np.random.Generator) -> np.ndarray:
    """Shot noise: the 8-bit level ``L`` of each value is replaced by a Poisson count of mean ``L``, and the
    difference (std ``sqrt(L) / 255``) is added times ``scale_t``; clipped to [0, 1]. ``gray``: the noise of the
    luminance ``LUMA . rgb``, shared by the three channels.

    Args:
        clip: ``(T, H, W, 3)``.
        scale: ``(T,)`` noise multiplier per frame.
        gray: luminance noise instead of one per channel.
        rng: the clip's generator.
    """
    x = to_float32(clip)
    src = x[..., :1] * LUMA[0] + x[..., 1:2] * LUMA[1] + x[..., 2:] * LUMA[2] if gray else x
    src = np.clip(src, 0, 1)
    levels = np.rint(src * 255).astype(np.float64)
    noise = (rng.poisson(levels) - levels).astype(np.float32)
    noise *= (np.asarray(scale, np.float32) / np.float32(255))[:, None, None, None]
    x += noise
    return np.clip(x, 0, 1, out=x)


# ------------------------------------------------------------------------------------------------------------- JPEG
def jpeg_clip(clip: np.ndarray, quality: np.ndarray) -> np.ndarray:
    """Encode each frame as a JPEG of quality ``quality[t]`` (1..100; libjpeg through OpenCV, 4:2:0 chroma) and
    decode it. float32 ``(T, H, W, 3)`` on the 8-bit levels."""
    levels = to_uint8(clip)
    out = np.empty(levels.shape, np.float32)
    for t in range(levels.shape[0]):
        ok, buf = cv2.imencode(".jpg", levels[t, ..., ::-1], [cv2.IMWRITE_JPEG_QUALITY, int(quality[t])])
        if not ok:
            raise RuntimeError(f"OpenCV could not encode a {levels.shape[2]}x{levels.shape[1]} frame as JPEG")
        out[t] = cv2.imdecode(buf, cv2.IMREAD_COLOR)[..., ::-1]
    out /= np.float32(255)
    return out
