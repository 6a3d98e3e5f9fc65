"""The BI and BD degradations of the VSR benchmarks, in NumPy (no MATLAB).

- **BI**: ``modcrop(img, 4)`` then MATLAB ``imresize(img, 1/4, 'bicubic')``: the Keys cubic kernel (a = -0.5),
  widened by 1/scale for antialiasing when shrinking, weights normalised per output pixel, symmetric
  (mirror) border, rows resized before columns (``generate_LR_Vimeo90K.m``).
- **BD**: ``modcrop(img, 4)``, then a Gaussian of sigma 1.6 and size ``ceil(3 sigma) * 2 + 2 = 12``
  (``fspecial('gaussian', 12, 1.6)``), applied as ``imfilter(img, k, 'replicate')`` (correlation; MATLAB
  anchors an even kernel at its 6th tap, so output pixel i sees inputs i-5 .. i+6), then every 4th pixel
  starting at the 2nd (1-based; ``img(2:4:end-2, ...)``) (``generate_LR_Vimeo90K_BD.m``).

Images are ``(H, W)`` or ``(H, W, C)``; computation is in float64 on [0, 1] (MATLAB's ``im2double``);
:func:`to_uint8` rounds like MATLAB's ``im2uint8`` / ``imwrite`` (clip, then round half away from zero).
"""

from __future__ import annotations

import math

import numpy as np

from data.degradations import cubic, gaussian_kernel_1d, matlab_resize_matrix

__all__ = ["bd_degrade", "bi_degrade", "cubic", "gaussian_kernel_1d", "imresize_matlab", "modcrop", "to_uint8"]


def modcrop(img: np.ndarray, modulo: int) -> np.ndarray:
    """Crop the bottom / right so that H and W are multiples of ``modulo`` (MATLAB ``modcrop``)."""
    h, w = img.shape[:2]
    return img[:h - h % modulo, :w - w % modulo]


def to_float(img: np.ndarray) -> np.ndarray:
    """uint8 -> float64 in [0, 1] (``im2double``); float input is only cast."""
    return img.astype(np.float64) / 255.0 if img.dtype == np.uint8 else img.astype(np.float64)


def to_uint8(img: np.ndarray) -> np.ndarray:
    """Float in [0, 1] -> uint8 as MATLAB writes it: clip to [0, 1], ``x * 255`` rounded half away from zero."""
    return np.floor(np.clip(img, 0.0, 1.0) * 255.0 + 0.5).astype(np.uint8)


def imresize_matlab(img: np.ndarray, scale: float, antialias: bool = True) -> np.ndarray:
    """MATLAB ``imresize(img, scale, 'bicubic')`` on a float image; output ``ceil(scale * H) x ceil(scale * W)``.

    Args:
        img: ``(H, W)`` or ``(H, W, C)``; uint8 is converted to [0, 1] first.

    Returns:
        float64, same number of dimensions, not clipped.
    """
    x = to_float(img)
    h, w = x.shape[:2]
    out_h, out_w = int(math.ceil(h * scale)), int(math.ceil(w * scale))
    rows = matlab_resize_matrix(h, out_h, scale, antialias)
    cols = matlab_resize_matrix(w, out_w, scale, antialias)
    y = np.tensordot(rows, x, axes=(1, 0))  # rows first, as MATLAB does for equal scales
    y = np.moveaxis(np.tensordot(cols, y, axes=(1, 1)), 0, 1)
    return y


def bi_degrade(img: np.ndarray, scale: int = 4) -> np.ndarray:
    """BI: ``imresize(modcrop(img, scale), 1 / scale, 'bicubic')``; float64 in [0, 1] (round with to_uint8)."""
    return imresize_matlab(modcrop(to_float(img), scale), 1.0 / scale)


def _filter_replicate(x: np.ndarray, k: np.ndarray, axis: int) -> np.ndarray:
    """MATLAB ``imfilter`` (correlation, 'replicate') along one axis; anchor tap ``(len(k) + 1) // 2`` (1-based)."""
    before = (len(k) - 1) // 2
    after = len(k) - 1 - before
    pad = [(0, 0)] * x.ndim
    pad[axis] = (before, after)
    xp = np.pad(x, pad, mode="edge")
    n = x.shape[axis]
    out = np.zeros_like(x)
    for j, kj in enumerate(k):
        out += kj * np.take(xp, np.arange(j, j + n), axis=axis)
    return out


def bd_degrade(img: np.ndarray, scale: int = 4, sigma: float = 1.6) -> np.ndarray:
    """BD: Gaussian blur (sigma 1.6, 12 taps, replicate border) of ``modcrop(img, scale)``, then
    ``img(scale/2 : scale : end - scale/2)`` (1-based) on both axes; float64 in [0, 1]."""
    x = modcrop(to_float(img), scale)
    k = gaussian_kernel_1d(sigma)
    x = _filter_replicate(_filter_replicate(x, k, 0), k, 1)
    s = scale // 2 - 1  # 0-based start
    h, w = x.shape[:2]
    return x[s:h - scale // 2:scale, s:w - scale // 2:scale]
