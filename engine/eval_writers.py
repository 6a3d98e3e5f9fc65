"""What a segment of ``main_test_vrt.py`` leaves beside its marker, and the clip videos.

Beside the marker (``<save_dir>/.eval_state/<clip>/<start>-<stop>.*``): the luma planes VMAF reads
(:class:`Spool`, scored per clip once every segment is in) and the report's comparison frame
(:func:`write_compare`). Clip videos (``--save_video``): a clip in one segment is written as it streams; a clip in
several is written as lossless parts, joined by :func:`assemble_videos` once every part is done.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import torch

from engine.eval_jobs import Segment
from engine.eval_run import EvalClip, EvalRun, side_file
from engine.report import comparison_panels, encode_png
from utils.metrics.niqe import rgb_to_y
from utils.utils_fs import atomic_open, temporary_name
from utils.utils_video_clips import clip_video_writer
from utils.utils_video_file import VideoReader, VideoWriter


def u8(frame: torch.Tensor) -> np.ndarray:
    """(3, H, W) float in [0, 1] -> (H, W, 3) uint8, rounded as the saved PNGs are."""
    return frame.detach().float().cpu().clamp(0, 1).mul(255).round().to(torch.uint8).permute(1, 2, 0).numpy()


def _luma(frame: torch.Tensor) -> np.ndarray:
    """The (H, W) uint8 luma VMAF reads (utils.metrics.scorer feeds the same)."""
    return rgb_to_y(u8(frame)).astype(np.uint8)


def input_frame(clip: EvalClip, index: int, center_frame_only: bool) -> torch.Tensor:
    """The input frame of output frame ``index`` of a streamed clip (``(C, h, w)``)."""
    assert clip.lazy is not None
    source = clip.lazy["L"]
    at = len(source) // 2 if center_frame_only else index
    frames = source.frames(at)
    try:
        return next(iter(frames))
    finally:
        close = getattr(frames, "close", None)
        if close is not None:
            close()


class Spool:
    """A segment's luma planes for VMAF, appended frame by frame to temporary files, renamed when complete."""

    def __init__(self, ctx: EvalRun, clip: EvalClip, seg: Segment) -> None:
        self.paths = {k: side_file(ctx, clip, seg, f"vmaf_{k}.y") for k in ("out", "gt")}
        self.tmp = {k: temporary_name(p) for k, p in self.paths.items()}
        os.makedirs(os.path.dirname(self.paths["out"]), exist_ok=True)
        self.files = {k: open(p, "wb") for k, p in self.tmp.items()}  # noqa: SIM115 (closed in close/abort)
        self.shape: tuple[int, int] | None = None

    def add(self, out: torch.Tensor, gt: torch.Tensor) -> None:
        for key, frame in (("out", out), ("gt", gt)):
            plane = _luma(frame)
            self.shape = plane.shape
            self.files[key].write(plane.tobytes())

    def close(self) -> dict[str, Any]:
        for key, f in self.files.items():
            f.close()
            os.replace(self.tmp[key], self.paths[key])
        return {**{k: os.path.basename(p) for k, p in self.paths.items()}, "shape": list(self.shape or (0, 0))}

    def abort(self) -> None:
        for key, f in self.files.items():
            f.close()
            if os.path.exists(self.tmp[key]):
                os.remove(self.tmp[key])


def write_compare(ctx: EvalRun, clip: EvalClip, seg: Segment, name: str, lq: torch.Tensor, out: torch.Tensor,
                  gt: torch.Tensor | None) -> dict[str, Any]:
    """The report's comparison frame of a clip: input (upscaled) | output | GT as PNG files beside the marker."""
    files = {}
    for panel, rgb in comparison_panels(lq, out, gt).items():
        path = side_file(ctx, clip, seg, f"compare_{panel}.png")
        with atomic_open(path, "wb") as f:  # a temporary that ResultStore.clear_temporaries removes after a crash
            f.write(encode_png(rgb))
        files[panel] = os.path.basename(path)
    return {"frame": name, "files": files}


def segment_writer(ctx: EvalRun, clip: EvalClip, seg: Segment, frame: torch.Tensor) -> VideoWriter:
    """The clip's video for a clip in one segment; else a lossless part, assembled when every part is done."""
    assert clip.lazy is not None
    if seg.parts > 1:
        return VideoWriter(ctx.store.part_path(clip.folder, seg), clip.lazy.get("fps", 25))
    ctx.store.clear_temporaries(clip.folder, None)
    return clip_video_writer(ctx.save_dir, clip.folder, frame.shape[-2], frame.shape[-1], clip.lazy.get("fps", 25),
                             audio_from=clip.lazy.get("video_path"), **codec(ctx))


def codec(ctx: EvalRun) -> dict[str, Any]:
    """``--video_codec``/``--video_crf`` as keyword arguments of the clip video writers."""
    return {"codec": ctx.args.video_codec, "crf": ctx.args.video_crf}


def assemble_videos(ctx: EvalRun) -> None:
    """``--save_video`` of clips in several segments: join the lossless parts into the clip's video (clips shared
    out over the ranks), then remove the parts."""
    if not ctx.args.save_video:
        return
    split = [clip for clip in ctx.clips if clip.lazy is not None and len(clip.segments) > 1]
    for position, clip in enumerate(split):
        if position % ctx.world != ctx.rank or ctx.store.video_done(clip.folder) is not None:
            continue
        assert clip.lazy is not None
        ctx.store.clear_temporaries(clip.folder, None)
        parts = [ctx.store.part_path(clip.folder, seg) for seg in clip.segments]
        writer: VideoWriter | None = None
        try:
            for part in parts:
                with VideoReader(part) as reader:
                    for frame in reader:
                        writer = writer or clip_video_writer(ctx.save_dir, clip.folder, frame.shape[0],
                                                             frame.shape[1], clip.lazy.get("fps", 25),
                                                             audio_from=clip.lazy.get("video_path"), **codec(ctx))
                        writer.write(frame)
            assert writer is not None
            writer.close()
        except BaseException:
            if writer is not None:
                writer.abort()
            raise
        ctx.store.mark_video(clip.folder, writer.path, parts)
