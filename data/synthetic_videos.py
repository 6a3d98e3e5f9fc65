"""Synthetic H.264 videos for the real-world demo (its training GT videos and its held-out footage without GT):
written into the folder an option file's ``synthesize_if_missing`` names (``data.data_roots.writes_synthetic``
decides whether it may), whole or not at all.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import numpy as np

from data.dataset_synthetic import render_clip
from utils.utils_fs import atomic_path
from utils.utils_video_file import VideoWriter

logger = logging.getLogger(__name__)

__all__ = ["SYNTHESIZE_CRF", "SYNTHESIZE_DEFAULTS", "SYNTHESIZE_FPS", "refuse_synthesize", "synthesize_videos"]

SYNTHESIZE_DEFAULTS: dict[str, Any] = {"num_videos": 4, "num_frames": 60, "size": [256, 256], "seed": 0}
SYNTHESIZE_CRF = 12  # near-transparent H.264: the synthetic videos are GT
SYNTHESIZE_FPS = 25


def refuse_synthesize(value: dict | None) -> str | None:
    """Why a ``synthesize_if_missing`` value is invalid (the option's ``refuse`` check), or ``None``."""
    if value is None:
        return None
    unknown = sorted(set(value) - {*SYNTHESIZE_DEFAULTS, "root"})
    if unknown:
        return f"unknown key(s) {unknown}; use {sorted({*SYNTHESIZE_DEFAULTS, 'root'})}"
    if not isinstance(value.get("root"), str) or not value["root"]:
        return ("needs 'root': the folder it may write, the same as dataroot_gt (dataroot_lq for a test set "
                "without GT; synthetic data is written only where the option file asks for it)")
    spec = {**SYNTHESIZE_DEFAULTS, **value}
    ints = [spec["num_videos"], spec["num_frames"], spec["seed"]]
    size = spec["size"]
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in ints) or min(ints[:2]) < 1:
        return "num_videos and num_frames must be integers >= 1, seed an integer >= 0"
    if not (isinstance(size, list) and len(size) == 2 and all(isinstance(s, int) and s >= 16 and s % 2 == 0
                                                              for s in size)):
        return "size must be [H, W], even integers >= 16 (H.264 4:2:0 needs an even size)"
    return None


def synthesize_videos(root: str, spec: dict[str, Any], key: str = "dataroot_gt") -> bool:
    """Write ``spec['num_videos']`` synthetic H.264 videos (``synthetic_000.mp4``, ...) into the new folder ``root``.

    Videos are rendered by :func:`data.dataset_synthetic.render_clip` from ``(seed, k)``, ``num_frames`` frames of
    ``size`` ``[H, W]``, at 25 fps, CRF 12. They are written into a temporary folder beside ``root`` that is then
    renamed onto it (:func:`utils.utils_fs.atomic_path`), so ``root`` appears complete or not at all; if another
    process made ``root`` meanwhile, its folder is kept. ``key`` names the option ``root`` stands for in the log.

    Returns:
        Whether this call wrote ``root`` (``False``: it already existed).
    """
    if os.path.exists(root):
        return False
    root = os.path.abspath(root)
    height, width = spec["size"]
    logger.info("%s %s does not exist: writing %d synthetic videos (%d frames of %dx%d)", key, root,
                spec["num_videos"], spec["num_frames"], width, height)
    try:
        with atomic_path(root) as tmp:
            os.makedirs(tmp)
            for k in range(spec["num_videos"]):
                clip = render_clip(np.random.default_rng([spec["seed"], k]), spec["num_frames"], height, width)
                with VideoWriter(os.path.join(tmp, f"synthetic_{k:03d}.mp4"), SYNTHESIZE_FPS, codec="h264",
                                 crf=SYNTHESIZE_CRF) as writer:
                    for frame in np.round(clip * 255).astype(np.uint8):
                        writer.write(frame)
    except OSError:
        if not os.path.isdir(root):
            raise
        return False  # another process won the race; its (identical) videos are kept
    return True
