"""Test dataset over video files (mp4/avi/mkv/mov/...), read with OpenCV, one item per video.

Items follow the test-dataset contract: ``{'L': (T, C, h, w), 'H': (T, 3, H, W) (when a GT video is given),
'folder': <video stem>, 'lq_path': [...], 'gt_path': [...], 'fps': float}``, float32 RGB in [0, 1]. The frame
"paths" are ``<stem>/<index:08d>`` names, used to name the output frames.
"""

from __future__ import annotations

import glob
import logging
import os
from typing import Any

import cv2
import numpy as np
import torch
from torch.utils.data import Dataset

from data.dataset_video_test import add_noise

logger = logging.getLogger(__name__)

__all__ = ["VIDEO_EXTENSIONS", "VideoFileTestDataset", "is_video_file", "read_video", "write_video"]

VIDEO_EXTENSIONS = (".mp4", ".avi", ".mkv", ".mov", ".webm", ".m4v", ".mpg", ".mpeg", ".wmv")


def is_video_file(path: str) -> bool:
    """Whether ``path`` names an existing file with a video extension."""
    return os.path.isfile(path) and path.lower().endswith(VIDEO_EXTENSIONS)


def list_videos(root: str) -> list[str]:
    """``[root]`` for a video file, else the sorted video files directly inside the directory ``root``."""
    if is_video_file(root):
        return [root]
    return sorted(p for p in glob.glob(os.path.join(glob.escape(root), "*")) if is_video_file(p))


def read_video(path: str) -> tuple[torch.Tensor, float]:
    """Decode a whole video.

    Returns:
        ``(T, 3, H, W)`` float32 RGB in [0, 1] and the frame rate (25 when the container does not say).
    """
    cap = cv2.VideoCapture(path)
    if not cap.isOpened():
        raise OSError(f"cannot open video {path!r} (unreadable or unsupported by OpenCV)")
    fps = cap.get(cv2.CAP_PROP_FPS) or 25.0
    frames = []
    try:
        while True:
            ok, frame = cap.read()
            if not ok:
                break
            frames.append(torch.from_numpy(np.ascontiguousarray(frame[..., ::-1])).permute(2, 0, 1))
    finally:
        cap.release()
    if not frames:
        raise OSError(f"video {path!r} has no decodable frame")
    return torch.stack(frames).float().div_(255.0), float(fps)


def write_video(path: str, frames: torch.Tensor, fps: float = 25.0) -> None:
    """Encode ``frames`` ``(T, 3, H, W)`` RGB in [0, 1] (clamped, rounded) to ``path``; the codec follows the
    extension (mp4v for .mp4/.mov, MJPG for .avi, XVID otherwise)."""
    ext = os.path.splitext(path)[1].lower()
    fourcc = {".mp4": "mp4v", ".mov": "mp4v", ".m4v": "mp4v", ".avi": "MJPG"}.get(ext, "XVID")
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    h, w = frames.shape[-2:]
    writer = cv2.VideoWriter(path, cv2.VideoWriter_fourcc(*fourcc), fps, (w, h))
    if not writer.isOpened():
        raise OSError(f"cannot write video {path!r} with codec {fourcc}")
    try:
        data = frames.detach().float().clamp(0, 1).mul(255).round().to(torch.uint8).permute(0, 2, 3, 1).numpy()
        for frame in data:
            writer.write(np.ascontiguousarray(frame[..., ::-1]))
    finally:
        writer.release()


class VideoFileTestDataset(Dataset):
    """One item per LQ video file, with the matching GT video (same file name) when ``dataroot_gt`` is given.

    Args:
        opt: ``dataroot_lq`` (a video file or a directory of them), ``dataroot_gt`` (optional: a video file or a
            directory holding videos of the same names), ``sigma`` (0-255; with GT and ``sigma > 0`` the input is
            GT plus Gaussian noise of that level, seeded by 0, with the sigma map as a 4th channel, like
            ``VideoRecurrentTestDataset``).
    """

    def __init__(self, opt: dict[str, Any]) -> None:
        super().__init__()
        self.lq_files = list_videos(opt["dataroot_lq"])
        if not self.lq_files:
            raise FileNotFoundError(f"dataroot_lq={opt['dataroot_lq']!r}: no video file "
                                    f"({', '.join(VIDEO_EXTENSIONS)})")
        gt_root = opt.get("dataroot_gt")
        self.gt_files: list[str | None] = [None] * len(self.lq_files)
        if gt_root:
            if is_video_file(gt_root):
                if len(self.lq_files) != 1:
                    raise ValueError(f"dataroot_gt={gt_root!r} is one video but dataroot_lq holds "
                                     f"{len(self.lq_files)}; give a directory of GT videos with the same names")
                self.gt_files = [gt_root]
            else:
                self.gt_files = [os.path.join(gt_root, os.path.basename(p)) for p in self.lq_files]
                missing = [p for p in self.gt_files if not os.path.isfile(p)]
                if missing:
                    raise FileNotFoundError(f"GT videos missing for {len(missing)} LQ video(s), e.g. {missing[0]}")
        self.sigma = float(opt.get("sigma", 0) or 0) / 255.0

    def __len__(self) -> int:
        return len(self.lq_files)

    def __getitem__(self, index: int) -> dict[str, Any]:
        lq_file, gt_file = self.lq_files[index], self.gt_files[index]
        stem = os.path.splitext(os.path.basename(lq_file))[0]
        lq, fps = read_video(lq_file)
        item: dict[str, Any] = {"folder": stem, "fps": fps}
        if gt_file is not None:
            gt, _ = read_video(gt_file)
            if gt.shape[0] != lq.shape[0]:
                raise ValueError(f"{lq_file} has {lq.shape[0]} frames but {gt_file} has {gt.shape[0]}")
            item["H"] = gt
            if self.sigma:
                lq = add_noise(gt, self.sigma, seed=0)
        item["L"] = lq
        names = [f"{i:08d}" for i in range(lq.shape[0])]
        item["lq_path"] = [os.path.join(stem, n) for n in names]
        item["gt_path"] = list(item["lq_path"])
        return item
