"""Temporal consistency as TecoGAN defines it (Chu et al., "Learning Temporal Coherence via Self-Supervision for
GAN-based Video Generation", 2020; ``metrics.py`` of github.com/thunil/TecoGAN), per frame t >= 1 of a clip:

- ``tof``: ``mean_px || OF(gt_{t-1}, gt_t) - OF(out_{t-1}, out_t) ||_2``, OF = OpenCV's Farneback flow of the
  grayscale frames (``cv2.cvtColor(RGB2GRAY)`` of the uint8 frames) with TecoGAN's parameters, the mean taken over
  TecoGAN's centre crop of the flow (:func:`crop_box`). Not scaled.
- ``tlp``: ``100 * | LPIPS(gt_{t-1}, gt_t) - LPIPS(out_{t-1}, out_t) |``, LPIPS v0.1 AlexNet on the centre-cropped
  frames; TecoGAN multiplies by 100 ("tLPx100") and so do we.

Both are lower-is-better and need the previous frame, so frame 0 of a clip has no value. TecoGAN's script also drops
two frames at each end of a clip (``cutfr = 2``) before averaging; we score every frame (a seam or a flicker at a
clip's ends is what we want to see), so a clip mean differs from TecoGAN's by those frames only.
"""

from __future__ import annotations

import cv2
import numpy as np

from utils.metrics.registry import MetricError

# pyr_scale, levels, winsize, iterations, poly_n, poly_sigma, flags of TecoGAN's calcOpticalFlowFarneback call
FARNEBACK = (0.5, 3, 15, 3, 5, 1.2, 0)
TLP_SCALE = 100.0


def crop_box(height: int, width: int) -> tuple[int, int, int, int]:
    """TecoGAN's ``crop_8x8``: the centred ``(top, left, h, w)`` with h, w multiples of 32 that leave at least 16
    pixels of border in total on each axis."""
    def side(n: int) -> int:
        m = n // 32 * 32
        while m > n - 16:
            m -= 32
        return m

    h, w = side(height), side(width)
    if h <= 0 or w <= 0:
        raise MetricError(f"tof/tlp need frames of at least 48x48 pixels, got {height}x{width}")
    return (height - h) // 2, (width - w) // 2, h, w


def gray(rgb: np.ndarray) -> np.ndarray:
    """(H, W, 3) uint8 RGB -> (H, W) uint8 gray, OpenCV's weights (as TecoGAN)."""
    return cv2.cvtColor(rgb, cv2.COLOR_RGB2GRAY)


def flow(prev: np.ndarray, cur: np.ndarray) -> np.ndarray:
    """Farneback optical flow (H, W, 2) float32 from gray frame ``prev`` to ``cur`` (TecoGAN's parameters)."""
    return cv2.calcOpticalFlowFarneback(prev, cur, None, *FARNEBACK)


def tof(out_prev: np.ndarray, out_cur: np.ndarray, gt_prev: np.ndarray, gt_cur: np.ndarray) -> float:
    """tOF of one frame pair from four (H, W) uint8 gray frames (the output's and the ground truth's t-1 and t)."""
    top, left, h, w = crop_box(*out_cur.shape[:2])
    diff = flow(gt_prev, gt_cur) - flow(out_prev, out_cur)
    diff = diff[top:top + h, left:left + w]
    return float(np.sqrt((diff * diff).sum(-1)).mean())


def tlp(lpips_gt: float, lpips_out: float) -> float:
    """tLP of one frame pair from LPIPS(gt_{t-1}, gt_t) and LPIPS(out_{t-1}, out_t) (centre-cropped frames)."""
    return abs(lpips_gt - lpips_out) * TLP_SCALE
