"""Real footage for the evaluation tests: a scikit-image sample photograph filmed by a panning camera (a window
sliding across the photo), as clips of PNG frames or an H.264 video written by PyAV, with its bicubic LQ."""

from __future__ import annotations

import os

import numpy as np
import torch
import torch.nn.functional as F

from data.dataset_video_file import write_video
from utils.utils_image import imwrite_rgb


def pan(photo: str = "astronaut", frames: int = 6, size: tuple[int, int] = (128, 128), step: tuple[int, int] = (3, 5),
        start: tuple[int, int] = (60, 140)) -> torch.Tensor:
    """``(frames, 3, H, W)`` float in [0, 1]: the camera pans by ``step`` pixels (down, right) a frame."""
    from skimage import data

    img = getattr(data, photo)()
    if img.ndim == 2:
        img = np.repeat(img[..., None], 3, axis=2)
    h, w = size
    crops = [img[start[0] + t * step[0]: start[0] + t * step[0] + h, start[1] + t * step[1]: start[1] + t * step[1] + w,
                 :3] for t in range(frames)]
    return torch.from_numpy(np.stack(crops)).permute(0, 3, 1, 2).float() / 255


def downscale(gt: torch.Tensor, scale: int) -> torch.Tensor:
    """The bicubic LQ of ``gt`` (T, 3, H, W), clamped to [0, 1]."""
    return F.interpolate(gt, scale_factor=1 / scale, mode="bicubic", align_corners=False).clamp(0, 1)


def write_clip(root: str, clip: str, frames: torch.Tensor) -> None:
    """``root/clip/00000000.png``, ... (a KAIR clip folder)."""
    for t, frame in enumerate(frames):
        imwrite_rgb(os.path.join(root, clip, f"{t:08d}.png"), frame)


def write_footage(path: str, frames: torch.Tensor, fps: int = 25) -> str:
    """``frames`` as an H.264 video (B-frames, 4:2:0) at ``path``: footage as a camera or phone leaves it."""
    write_video(path, frames, fps=fps, codec="h264", crf=18)
    return path


def conv_baseline(folder) -> list[str]:
    """A x4 convolutional baseline (seeded weights) and an option file of it (whole clips, whole frames) in
    ``folder``; returns the ``--opt``/``--model_path`` flags of ``main_test_vrt.py``."""
    import copy
    import json

    from models.network_baseline import VideoConvBaseline
    from tests.support.helpers import TINY_OPT

    opt = copy.deepcopy(TINY_OPT)
    opt["val"] = {"num_frame_testing": 0, "size_patch_testing": 0}
    opt["path"]["root"] = os.path.join(folder, "experiments")
    with open(os.path.join(folder, "opt.json"), "w") as f:
        json.dump(opt, f)
    torch.manual_seed(0)
    torch.save({"params": VideoConvBaseline(upscale=4, num_feat=8, num_block=1).state_dict()},
               os.path.join(folder, "w.pth"))
    return ["--opt", os.path.join(folder, "opt.json"), "--model_path", os.path.join(folder, "w.pth")]
