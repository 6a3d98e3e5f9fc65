"""Scoring restored clips the reference's way, shared by validation during training and ``main_test_vrt.py``:
per-frame metrics, the per-clip mean, the mean over clips, output frame names and KAIR's log lines."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from utils.utils_image import frame_metrics

METRICS = ("psnr", "ssim", "psnr_y", "ssim_y")


def clip_scores(out: torch.Tensor, gt: torch.Tensor) -> list[dict[str, float]]:
    """Metrics of every frame. ``out``, ``gt``: (T, 3, H, W) in [0, 1].

    Raises:
        ValueError: the shapes differ.
    """
    if out.shape != gt.shape:
        raise ValueError(f"output {tuple(out.shape)} and ground truth {tuple(gt.shape)} differ")
    return [frame_metrics(o, g) for o, g in zip(out, gt)]


def mean_scores(scores: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """The mean of each metric (the reference averages frames within a clip, then clips)."""
    return {k: sum(s[k] for s in scores) / len(scores) for k in METRICS}


def frame_names(paths: Any, count: int) -> list[str]:
    """Names of ``count`` output frames from the item's frame paths: all of them when they match, the middle one
    for a single output frame (Vimeo centre frame, interpolation), else the first ``count``; ``00000000``... when
    the item has no usable paths."""
    if isinstance(paths, (list, tuple)) and len(paths) >= count and all(isinstance(p, str) for p in paths):
        names = [os.path.basename(p).split(".")[0] for p in paths]
        start = (len(names) - count) // 2 if count == 1 else 0
        return names[start:start + count]
    return [f"{i:08d}" for i in range(count)]


def testing_line(name: str, index: int, total: int, mean: Mapping[str, float] | None) -> str:
    """KAIR's per-clip line: ``Testing <clip> ( i/n) - PSNR: x dB; SSIM: x; PSNR_Y: x dB; SSIM_Y: x``."""
    if mean is None:
        return f"Testing {name:<20s} ({index:2d}/{total}) - no ground truth"
    return (f"Testing {name:<20s} ({index:2d}/{total}) - PSNR: {mean['psnr']:.2f} dB; SSIM: {mean['ssim']:.4f}; "
            f"PSNR_Y: {mean['psnr_y']:.2f} dB; SSIM_Y: {mean['ssim_y']:.4f}")


def baseline_text(mean: Mapping[str, float]) -> str:
    """The input baseline's line, worded so that KAIR's log parsers (which match ``Average PSNR:`` and
    ``- PSNR:``) never take it for the model's score: ``Input baseline: PSNR x dB; SSIM x; PSNR_Y x dB; SSIM_Y x``."""
    return (f"Input baseline (the LQ input itself, bicubic-upsampled when scale > 1): PSNR {mean['psnr']:.2f} dB; "
            f"SSIM {mean['ssim']:.4f}; PSNR_Y {mean['psnr_y']:.2f} dB; SSIM_Y {mean['ssim_y']:.4f}")


def average_text(mean: Mapping[str, float]) -> str:
    """``Average PSNR: x dB; SSIM: x; PSNR_Y: x dB; SSIM_Y: x`` (KAIR's wording)."""
    return (f"Average PSNR: {mean['psnr']:.2f} dB; SSIM: {mean['ssim']:.4f}; PSNR_Y: {mean['psnr_y']:.2f} dB; "
            f"SSIM_Y: {mean['ssim_y']:.4f}")
