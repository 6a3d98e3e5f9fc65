"""Validation during training, sharded over all ranks, with KAIR's log lines.

Clip ``i`` of the test set is restored by rank ``i % world_size`` (no rank idles, none waits forever when the
clips do not divide); per-clip metric means are summed over ranks, so every process ends with the same numbers
as a single-process validation. Inference runs on the bare or EMA network, never through DDP.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils.data import Dataset

from engine.scoring import METRICS, average_text, clip_scores, frame_names, mean_scores, testing_line
from utils import utils_dist
from utils.utils_image import imwrite_rgb

logger = logging.getLogger(__name__)

def _strip(lq: torch.Tensor, out: torch.Tensor, gt: torch.Tensor | None) -> torch.Tensor:
    """``(3, H, 3W)`` image: LQ (bilinearly upsampled) | output | GT, of the middle output frame."""
    t = out.shape[0] // 2
    lq_frame = lq[min(t, lq.shape[0] - 1), :3][None]
    lq_up = F.interpolate(lq_frame, size=out.shape[-2:], mode="bilinear", align_corners=False)[0]
    panels = [lq_up, out[t], gt[t] if gt is not None else torch.zeros_like(out[t])]
    return torch.cat(panels, dim=-1).clamp(0, 1)


def validate(model: Any, test_set: Dataset, *, step: int, epoch: int, save_img: bool, images_dir: str,
             tb: Any = None, tb_images: bool = True, quiet: bool = False) -> dict[str, float] | None:
    """Restore every test clip (sharded over ranks), log per-clip and average metrics on rank 0.

    Args:
        model: a training model with ``infer(lq) -> (1, D', 3, H, W)`` CPU tensor.
        test_set: items ``{'L': (T, C, h, w), 'H': (T', 3, H, W) (optional), 'folder', 'lq_path', 'gt_path'}``.
        step: current step (for the log and image names).
        epoch: current epoch (for the log).
        save_img: write the restored frames to ``images_dir/<folder>/<frame>_<step>.png``.
        images_dir: ``experiments/<task>/images``.
        tb: the run's writer, :class:`utils.utils_trackers.RunLogger` (TensorBoard and the trackers, the same
            scalars), or a :class:`utils.utils_logger.TensorBoardWriter`, or ``None``.
        tb_images: also log an image strip (LQ | output | GT) of the first clip (``val.tb_images``).
        quiet: log nothing (the input baseline, which the caller logs in a line of its own: KAIR's per-clip and
            average lines are the model's alone, so that log parsers never read the baseline as a result).

    Returns:
        ``{'psnr', 'ssim', 'psnr_y', 'ssim_y'}`` averaged over clips (mean per clip, then over clips), on every
        rank; ``None`` when the test set has no ground truth.
    """
    rank, world = utils_dist.get_rank(), utils_dist.get_world_size()
    n = len(test_set)  # type: ignore[arg-type]
    table = torch.zeros(n, len(METRICS) + 1, dtype=torch.float64)  # metrics + has-GT flag
    folders = [""] * n
    for idx in range(rank, n, world):
        item = test_set[idx]
        lq = item["L"]
        out = model.infer(lq[None])[0]  # (D', 3, H, W) CPU
        gt = item.get("H")
        folder = str(item.get("folder", f"{idx:03d}"))
        folders[idx] = folder
        if save_img:
            for name, frame in zip(frame_names(item.get("gt_path") or item.get("lq_path"), out.shape[0]), out):
                imwrite_rgb(os.path.join(images_dir, folder, f"{name}_{step}.png"), frame)
        if gt is not None:
            try:
                mean = mean_scores(clip_scores(out, gt))
            except ValueError as exc:
                raise ValueError(f"test clip {folder}: {exc}") from exc
            table[idx, :-1] = torch.tensor([mean[k] for k in METRICS], dtype=torch.float64)
            table[idx, -1] = 1.0
        if idx == 0 and tb is not None and tb_images:
            tb.image("val/lq_output_gt", _strip(lq, out, gt), step)
    table = utils_dist.all_reduce_sum(table)
    folder_lists = [folders] if world == 1 else _gather_folders(folders)
    names = [next((fl[i] for fl in folder_lists if fl[i]), f"{i:03d}") for i in range(n)]
    have_gt = table[:, -1] > 0
    for i in range(n if not quiet else 0):
        logger.info("%s", testing_line(names[i], i, n, dict(zip(METRICS, table[i].tolist())) if have_gt[i] else None))
    if not bool(have_gt.any()):
        return None
    result = dict(zip(METRICS, table[have_gt, : len(METRICS)].mean(dim=0).tolist()))
    if not quiet:
        logger.info("<epoch:%3d, iter:%8s> %s", epoch, f"{step:,d}", average_text(result))
    if tb is not None:
        tb.scalars({k.upper() if "_" not in k else k: v for k, v in result.items()}, step, prefix="val/")
    return result


def _gather_folders(folders: list[str]) -> list[list[str]]:
    out: list[Any] = [None] * utils_dist.get_world_size()
    torch.distributed.all_gather_object(out, folders)
    return out


def input_baseline(lq: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """The input as an estimate of the output: bicubic-upsampled LQ (SR), the LQ itself (deblurring/denoising),
    or the mean of the two middle input frames (interpolation).

    Args:
        lq: ``(1, T, C, h, w)``.
        like: an output tensor ``(1, T', 3, H, W)`` giving the target shape.
    """
    frames = lq[0, :, :3]
    if like.shape[1] != frames.shape[0]:
        mid = frames.shape[0] // 2
        frames = frames[max(mid - 1, 0):mid + 1].mean(0, keepdim=True)
    if frames.shape[-2:] != like.shape[-2:]:
        frames = F.interpolate(frames, size=like.shape[-2:], mode="bicubic", align_corners=False)
    return frames.clamp(0, 1)[None]


class InputBaseline:
    """Stands in for a model in :func:`validate`: the input itself as the restored video."""

    def __init__(self, scale: int, vfi: bool) -> None:
        self.scale, self.vfi = scale, vfi

    def infer(self, lq: torch.Tensor) -> torch.Tensor:
        frames = 1 if self.vfi else lq.shape[1]
        like = torch.empty(1, frames, 3, lq.shape[-2] * self.scale, lq.shape[-1] * self.scale)
        return input_baseline(lq, like)
