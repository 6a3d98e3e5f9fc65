"""The logic of ``main_test_vrt.py``: build a released or trained model, restore test videos, score and save them.

Flag-compatible with the official VRT ``main_test_vrt.py`` and KAIR's ``main_test_rvrt.py`` (``--task``,
``--sigma``, ``--folder_lq``, ``--folder_gt``, ``--tile``, ``--tile_overlap``, ``--num_workers``,
``--save_result``), plus ``--model_path``/``--opt`` for checkpoints of ours, ``--device``, ``--amp``,
``--save_video``, ``--segment_frames``, ``--no_resume``, ``--metrics``, ``--metric_weights`` and ``--report``.
Metrics are any of the registry's (:mod:`utils.metrics`; KAIR's four by default, with the reference's log lines:
per-clip means, then the mean over clips); ``metrics.csv`` holds one row per frame, ``clips.csv`` one per clip,
``report.html`` (``--report``) shows both with per-frame curves and a before/after comparison.

Clips of frame folders and video files stream (:func:`models.video_stream.stream_video`): frames are read one at a
time, every output frame is saved and scored as soon as it is final, so host memory is bounded by about one
temporal tile whatever the length. Clips are cut into segments at tile ends (:mod:`engine.eval_jobs`) and the
segments shared out over the ranks of a ``torchrun`` launch; each complete segment leaves a marker, so a re-run
skips what is done. The per-frame metrics travel with the markers; rank 0 prints each clip once and the average
once, equal to a single-process run. Test sets of short items (Vimeo-90K-T, the interpolation sets) are restored an
item at a time, as before.

Metrics that look across frames are scored so that a clip cut into segments scores exactly as the whole clip: each
segment is scored one frame at a time by a scorer of its own; its first and last frames (output and GT, uint8) are
kept beside its marker, and the temporal terms (tOF, tLP) of each later segment's first frame are computed when the
clip's segments are joined, from the previous segment's last frame. VMAF, whose motion feature reads both
neighbours and whose clip value is pooled over the whole clip, is computed per clip from the luma planes the
segments spool under ``.eval_state`` (removed once the clip's score is recorded in ``vmaf.json``).
"""

from __future__ import annotations

import argparse
import csv
import logging
import os
import signal
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Subset
from tqdm import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

from data.dataset_video_file import clip_video_writer, write_clip_video
from engine import eval_jobs
from engine.eval_jobs import ResultStore, Segment
from engine.eval_setup import (
    TestSetup,
    build_parser,
    build_test_set,
    restore_clip,
    setup_model,
    tiling_kwargs,
)
from engine.report import ClipReport, comparison_panels, encode_png, write_report
from engine.scoring import (
    MetricError,
    MetricSpec,
    Scoring,
    average_lines,
    clip_values,
    frame_columns,
    frame_names,
    mean_over_clips,
    metric_specs,
    testing_lines,
)
from engine.validate import input_baseline, probe_frames
from models.model_zoo import ModelZooError
from models.video_stream import Prefetch, num_outputs, segment_bounds, stream_video
from utils import utils_checkpoint, utils_dist
from utils.metrics import check_clip_length
from utils.metrics.niqe import rgb_to_y
from utils.metrics.vmaf import vmaf_clip
from utils.utils_fs import atomic_open, temporary_name
from utils.utils_image import imwrite_rgb
from utils.utils_numerics import AMP_DTYPES
from utils.utils_signals import ignore_stop_signals, install_stop_handler, restore_handlers
from utils.utils_video_file import VideoReader, VideoWriter

logger = logging.getLogger(__name__)

class _Stopped(BaseException):
    """A stop signal arrived (a BaseException, like KeyboardInterrupt, so that no ``except Exception`` on the way
    takes it for a failed input)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signal = signal.Signals(signum)


def _stop_now(signum: int, frame: Any) -> None:
    del frame
    raise _Stopped(signum)


class _Failed(Exception):
    """The run failed on some rank, and the reason has been logged once."""


USER_ERRORS = (ModelZooError, FileNotFoundError, OSError, utils_checkpoint.CheckpointError, ValueError,
               utils_dist.DistError, ImportError)  # ImportError: an optional extra (onnxruntime) is missing


@dataclass
class _Clip:
    """A test item as the run sees it: streamed from frame sources (``lazy``), or restored whole."""

    index: int
    folder: str
    lazy: dict[str, Any] | None
    frames: int = 0  # input frames (0: an item restored whole, not known before it is read)
    names: list[str] = field(default_factory=list)  # output frame names of a streamed clip
    segments: list[Segment] = field(default_factory=list)

    @property
    def compared(self) -> int:
        """The output frame the report compares (the middle one)."""
        return len(self.names) // 2


@dataclass
class _Run:
    """Everything the phases of a run share."""

    args: argparse.Namespace
    setup: TestSetup
    test_set: Dataset
    device: torch.device
    amp: torch.dtype | None
    save_dir: str
    vimeo: bool
    rank: int
    world: int
    store: ResultStore
    clips: list[_Clip]
    scoring: Scoring
    records: dict[tuple[int, str], dict[str, Any]] = field(default_factory=dict)
    finals: dict[int, dict[str, Any]] = field(default_factory=dict)  # per clip: border terms, VMAF
    frames_restored: int = 0
    printed: int = 0

    @property
    def streamed(self) -> list[MetricSpec]:
        """The metrics a segment's scorer computes frame by frame (VMAF is scored per clip, at the end)."""
        return [s for s in self.scoring.specs if s.per_frame]

    @property
    def temporal(self) -> list[MetricSpec]:
        return [s for s in self.streamed if s.temporal]

    @property
    def vmaf(self) -> bool:
        return any(not s.per_frame for s in self.scoring.specs)


def _device(args: argparse.Namespace) -> torch.device:
    """``--device`` (``cuda`` means this process's GPU under torchrun), else the process's device: its GPU, or the
    CPU when there is none or ``VRT_DEVICE=cpu``."""
    info = utils_dist.get_dist_info()
    if args.device is None:
        return info.device
    device = torch.device(args.device)
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", info.local_rank)
    return device


def _specs(args: argparse.Namespace) -> list[MetricSpec]:
    """``--metrics`` (default: KAIR's four with ground truth, nothing without).

    Raises:
        MetricError: an unknown name, or a full-reference metric without ``--folder_gt`` (one line).
    """
    have_gt = args.folder_gt is not None
    if args.metrics is None and not have_gt:
        return []
    return metric_specs(args.metrics, have_gt)


def _prepare(args: argparse.Namespace) -> _Run:
    """Build the network and the test set, plan the segments and share them out (the same on every rank)."""
    rank, world = utils_dist.get_rank(), utils_dist.get_world_size()
    specs = _specs(args)  # bad metric names before anything is loaded
    if args.segment_frames < 1:
        raise ValueError(f"--segment_frames must be >= 1, got {args.segment_frames}")
    if args.video_crf is not None and (args.video_codec not in ("h264", "h265") or not 0 <= args.video_crf <= 51):
        raise ValueError(f"--video_crf {args.video_crf}: give 0-51 with --video_codec h264 or h265 "
                         f"({args.video_codec} is {'lossless' if args.video_codec in ('ffv1', 'png') else 'lossy'})")
    device = _device(args)
    amp = AMP_DTYPES[args.amp]
    setup = setup_model(args)
    setup.net.to(device)
    test_set = build_test_set(args, setup)
    if len(test_set) == 0:  # type: ignore[arg-type]
        raise FileNotFoundError(f"no test clip found in {args.folder_lq}")
    save_dir = args.save_dir or os.path.join("results", setup.name)
    vimeo = "vimeo" in args.folder_lq.lower()
    clips = _describe(test_set, setup)
    for clip in clips:  # a clip too short for a temporal metric, before any work
        check_clip_length(specs, len(clip.names) if clip.lazy is not None else 1, clip.folder)
    scoring = Scoring(specs, device, args.metric_weights)  # weights fetched (rank 0) and checked, networks loaded
    _check_frame_size(scoring, test_set, clips[0], setup)
    total = sum(c.frames if c.lazy is not None else 1 for c in clips)
    target = eval_jobs.segment_target(args.segment_frames, total, world)
    tiling = tiling_kwargs(setup)
    check_clips = getattr(setup.net, "check_clip_lengths", None)  # an ONNX graph's frames are fixed (onnx_runner)
    if check_clips is not None:
        check_clips([(c.folder, c.frames) for c in clips if c.lazy is not None], tiling)
    for clip in clips:
        if clip.lazy is None:
            clip.segments = [Segment(clip.index, 0, None, 0, 1)]
            continue
        bounds = segment_bounds(clip.frames, target, num_frame_testing=tiling["num_frame_testing"],
                                num_frame_overlapping=tiling["num_frame_overlapping"], pad_seq=tiling["pad_seq"],
                                vfi=tiling["vfi"], flip_seq=tiling["flip_seq"],
                                center_frame_only=tiling["center_frame_only"])
        clip.segments = [Segment(clip.index, a, b, i, len(bounds)) for i, (a, b) in enumerate(bounds)]
    settings = {"name": setup.name, "weights": eval_jobs.file_identity(setup.model_path),
                "net": type(setup.net).__name__, "opt": os.path.abspath(args.opt) if args.opt else None,
                "set": args.set, "tiling": tiling, "sigma": setup.sigma, "vimeo_mirror": setup.vimeo_mirror,
                "amp": args.amp, "device": device.type, "folder_lq": os.path.abspath(args.folder_lq),
                "video": [args.video_codec, args.video_crf] if args.save_video else None,
                "folder_gt": os.path.abspath(args.folder_gt) if args.folder_gt else None}
    store = ResultStore(save_dir, eval_jobs.fingerprint(settings), resume=not args.no_resume)
    return _Run(args, setup, test_set, device, amp, save_dir, vimeo, rank, world, store, clips, scoring)


def _check_frame_size(scoring: Scoring, test_set: Dataset, clip: _Clip, setup: TestSetup) -> None:
    """Refuse, before any work, a metric that cannot score the first clip's frames (too small for NIQE's blocks or
    the temporal metrics' crop): each is tried on the input baseline of the clip's first two frames.

    Raises:
        MetricError: naming the metric, the frame size and the minimum.
    """
    if not scoring.specs:
        return
    refused = scoring.unfit(*probe_frames(test_set, clip.index, setup.scale, setup.vfi))
    if refused:
        raise MetricError(next(iter(refused.values())))


def _describe(test_set: Dataset, setup: TestSetup) -> list[_Clip]:
    """Clip-folder and video test sets stream (``lazy_item``); the others are restored an item at a time."""
    lazy_item = getattr(test_set, "lazy_item", None)
    tiling = tiling_kwargs(setup)
    clips = []
    for index in range(len(test_set)):  # type: ignore[arg-type]
        if lazy_item is None:
            clips.append(_Clip(index, f"{index}", None))
            continue
        item = lazy_item(index)
        n = len(item["L"])
        if not clips and n:  # the data's channels against the network's, before any work
            first = next(iter(item["L"].frames(0)))
            setup.io.check_channels(first.shape[0], _input_name(item))
        if setup.vfi and setup.io.clip_frames and n != setup.io.clip_frames:  # likewise its frames per forward
            raise ValueError(f"{_input_name(item)}: frame interpolation with this network reads exactly "
                             f"{setup.io.clip_frames} frames per clip, this clip has {n} (the interpolation test sets' "
                             "folders, a path naming vimeo, davis, ucf101 or vid4, give it its frames)")
        count = num_outputs(n, vfi=setup.vfi, center_frame_only=tiling["center_frame_only"])
        paths = item.get("gt_path") if setup.vfi else item.get("lq_path")
        if tiling["center_frame_only"] and not setup.vfi and paths is not None:
            paths = paths[n // 2: n // 2 + 1]
        names = frame_names(paths if paths is not None else item.get("lq_path"), count)
        clips.append(_Clip(index, str(item["folder"]), item, n, names))
    return clips


def run(args: argparse.Namespace) -> dict[str, float] | None:
    """Test every clip (shared out over the ranks); returns the average metrics (``None`` when nothing was scored).

    Raises:
        _Failed: a rank failed; the reason has been logged once.
    """
    ctx = None
    try:
        ctx = _prepare(args)
        error = None
    except USER_ERRORS as exc:
        error = str(exc)
    _agree(error, logged=False)
    assert ctx is not None
    started = time.perf_counter()
    todo = _plan(ctx)
    mine = [seg for clip in ctx.clips for seg in clip.segments]
    owners = eval_jobs.assign_ranks([seg.weight for seg in mine], ctx.world)
    done_before = 0
    error = None
    try:
        done_before = _restore(ctx, [seg for seg, owner in zip(mine, owners) if owner == ctx.rank and
                                     (seg.clip, seg.key) in todo])
    except USER_ERRORS as exc:
        error = _log_error(ctx.rank, ctx.world, exc)
    gathered = utils_dist.all_gather_object((ctx.records, error, done_before, ctx.frames_restored,
                                     eval_jobs.peak_host_bytes(), eval_jobs.peak_device_bytes(ctx.device)))
    _agree(next((g[1] for g in gathered if g[1]), None), logged=True)
    for records, *_ in gathered:
        ctx.records.update(records)
    error = None
    try:
        _assemble_videos(ctx)
        _finish_clips(ctx)
    except USER_ERRORS as exc:
        error = _log_error(ctx.rank, ctx.world, exc)
    _agree(error, logged=True)
    for finals in utils_dist.all_gather_object(ctx.finals):
        ctx.finals.update(finals)
    if ctx.rank != 0:
        return None
    average = _report(ctx)
    frames = sum(g[3] for g in gathered)
    seconds = time.perf_counter() - started
    device_peaks = [g[5] for g in gathered if g[5] is not None]
    logger.info("Restored %d frames in %.1f s (%.2f frames/s) with %d process%s%s; peak host memory %.2f GiB, peak "
                "device memory %s", frames, seconds, frames / max(seconds, 1e-9), ctx.world,
                "es" if ctx.world > 1 else "",
                f" ({sum(g[2] for g in gathered)} complete segments skipped)" if any(g[2] for g in gathered) else "",
                max(g[4] for g in gathered) / 2**30,
                f"{max(device_peaks) / 2**30:.2f} GiB" if device_peaks else "n/a (CPU)")
    return average


def _agree(error: str | None, logged: bool) -> None:
    """Every rank learns whether any failed; ``logged=False``: the error is common to all ranks (set-up), rank 0
    logs the first one."""
    errors = utils_dist.all_gather_object(error)
    failed = [(rank, e) for rank, e in enumerate(errors) if e]
    if not failed:
        return
    if not logged and utils_dist.get_rank() == 0:
        rank, message = failed[0]
        logger.error("error: %s%s", f"[rank {rank}] " if rank else "", message)
    raise _Failed(failed[0][1])


def _log_error(rank: int, world: int, exc: BaseException) -> str:
    logger.error("error: %s%s", f"[rank {rank}] " if world > 1 else "", exc)
    return str(exc) or type(exc).__name__


# ---------------------------------------------------------------------------------------------- what is done
def _plan(ctx: _Run) -> set[tuple[int, str]]:
    """Rank 0 reads every segment's marker and decides which segments are restored (the same answer on every
    rank, before any rank writes one); the records of the complete ones land in ``ctx.records``."""
    plan = None
    if ctx.rank == 0:
        records, todo = {}, set()
        for clip in ctx.clips:
            for seg in clip.segments:
                record = ctx.store.load(None if clip.lazy is None else clip.folder, seg, clip.frames,
                                        ctx.args.save_result, ctx.args.save_video)
                if record is not None and _usable(ctx, clip, seg, record):
                    records[(seg.clip, seg.key)] = record
                else:
                    todo.add((seg.clip, seg.key))
            if ctx.vmaf and clip.lazy is not None and any((s.clip, s.key) in todo for s in clip.segments):
                for seg in clip.segments:  # the clip's VMAF is scored again: every segment needs its spool
                    record = records.get((seg.clip, seg.key))
                    if record is not None and not _spooled(ctx, clip, record):
                        todo.add((seg.clip, seg.key))
                        del records[(seg.clip, seg.key)]
        plan = (records, todo, ctx.store.stale)
    records, todo, ctx.store.stale = utils_dist.broadcast_object(plan)
    ctx.records.update(records)
    return todo


def _side_file(ctx: _Run, clip: _Clip, seg: Segment, what: str) -> str:
    return ctx.store.side_path(None if clip.lazy is None else clip.folder, seg, what)


def _usable(ctx: _Run, clip: _Clip, seg: Segment, record: dict[str, Any]) -> bool:
    """Whether a complete segment's record holds what this run needs: every chosen metric, the boundary frames of
    the temporal metrics, the report's comparison frame."""
    names = [s.name for s in (ctx.streamed if clip.lazy is not None else ctx.scoring.specs)]
    if names and (record.get("metrics") is None or not set(names) <= set(record.get("metric_names") or ())):
        return False
    if ctx.temporal and len(clip.segments) > 1 and not _exists(ctx, clip, seg, record.get("edges")):
        return False
    if ctx.args.report and _holds_compared(clip, seg):
        files = (record.get("compare") or {}).get("files") or {}
        return bool(files) and all(_exists(ctx, clip, seg, f) for f in files.values())
    return True


def _exists(ctx: _Run, clip: _Clip, seg: Segment, name: str | None) -> bool:
    return bool(name) and os.path.isfile(os.path.join(os.path.dirname(_side_file(ctx, clip, seg, "x")), str(name)))


def _spooled(ctx: _Run, clip: _Clip, record: dict[str, Any]) -> bool:
    seg = next(s for s in clip.segments if s.key == record["segment"])
    spool = record.get("vmaf_spool") or {}
    return all(_exists(ctx, clip, seg, spool.get(k)) for k in ("out", "gt"))


def _holds_compared(clip: _Clip, seg: Segment) -> bool:
    return seg.stop is None or seg.start <= clip.compared < seg.stop


# ----------------------------------------------------------------------------------------------- restoration
def _restore(ctx: _Run, segments: list[Segment]) -> int:
    """Restore this rank's segments that are not complete yet; returns how many of its share were complete."""
    todo = segments
    mine = eval_jobs.assign_ranks([s.weight for c in ctx.clips for s in c.segments], ctx.world)
    keys = [(s.clip, s.key) for c in ctx.clips for s in c.segments]
    skipped = sum(1 for key, owner in zip(keys, mine) if owner == ctx.rank and key in ctx.records)
    if ctx.store.stale and ctx.rank == 0:
        logger.info("%d segment(s) in %s were restored by a different command (network, weights, tiles or inputs "
                    "changed): restoring them again", ctx.store.stale, ctx.store.root)
    if skipped:
        logger.info("%d segment(s) already complete in %s (%s): skipping them", skipped, ctx.save_dir,
                    eval_jobs.STATE_DIR)
    _print_ready(ctx)
    runs: list[list[Segment]] = []
    for seg in todo:  # neighbouring segments of a clip stream in one pass (their shared tile runs once)
        last = runs[-1][-1] if runs else None
        if (last is not None and ctx.clips[seg.clip].lazy is not None and last.clip == seg.clip
                and last.stop == seg.start):
            runs[-1].append(seg)
        else:
            runs.append([seg])
    whole = [r[0] for r in runs if ctx.clips[r[0].clip].lazy is None]
    for run_ in runs:
        if ctx.clips[run_[0].clip].lazy is not None:
            _restore_stream(ctx, ctx.clips[run_[0].clip], run_)
            _print_ready(ctx)
    if whole:
        _restore_whole(ctx, whole)
    return skipped


def _print_ready(ctx: _Run) -> None:
    """One process: log each clip's lines as soon as all its segments are in (several: rank 0 logs at the end)."""
    if ctx.world > 1:
        return
    while ctx.printed < len(ctx.clips) and all((s.clip, s.key) in ctx.records for s in ctx.clips[ctx.printed].segments):
        clip = ctx.clips[ctx.printed]
        _finish_clip(ctx, clip)
        result = _clip_result(ctx, clip)
        for line in testing_lines(result.folder, ctx.printed, len(ctx.clips), result.values, ctx.scoring.specs):
            logger.info("%s", line)
        ctx.printed += 1


def _input_name(item: dict[str, Any]) -> str:
    """The input file (or first frame) of a test item, for messages."""
    paths = item.get("lq_path") or [item.get("folder", "")]
    return f"the test input {item.get('video_path') or paths[0]}"


def _restore_stream(ctx: _Run, clip: _Clip, segments: list[Segment]) -> None:
    """Stream consecutive segments of one clip: save, write and score each output frame as it comes; write each
    segment's marker when its last frame is done."""
    setup, item = ctx.setup, clip.lazy
    assert item is not None
    lq = item["L"]
    tiling = tiling_kwargs(setup)
    depth = max(int(tiling["num_frame_testing"]), 4)
    start, stop = segments[0].start, segments[-1].stop
    outputs = stream_video(setup.net, lq, **tiling, device=ctx.device, autocast_dtype=ctx.amp, start=start,
                           stop=stop, prefetch=depth)
    gt_source = item.get("H")
    gt: Iterator[torch.Tensor] | None = None
    if gt_source is not None:
        first = len(gt_source) // 2 if tiling["center_frame_only"] and not setup.vfi else start
        gt = Prefetch(gt_source.frames(first), depth)
    bar = tqdm(total=stop - start, desc=clip.folder, unit="frame", leave=False, disable=ctx.rank != 0)
    try:
        for seg in segments:
            ctx.records[(seg.clip, seg.key)] = _restore_segment(ctx, clip, seg, outputs, gt, bar)
    finally:
        bar.close()
        outputs.close()  # type: ignore[attr-defined]
        if gt is not None:
            gt.close()


def _u8(frame: torch.Tensor) -> np.ndarray:
    """(3, H, W) float in [0, 1] -> (H, W, 3) uint8, rounded as the saved PNGs are."""
    return frame.detach().float().cpu().clamp(0, 1).mul(255).round().to(torch.uint8).permute(1, 2, 0).numpy()


def _luma(frame: torch.Tensor) -> np.ndarray:
    """The (H, W) uint8 luma VMAF reads (utils.metrics.scorer feeds the same)."""
    return rgb_to_y(_u8(frame)).astype(np.uint8)


def _input_frame(clip: _Clip, index: int, center_frame_only: bool) -> torch.Tensor:
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


class _Spool:
    """A segment's luma planes for VMAF, appended frame by frame to temporary files, renamed when complete."""

    def __init__(self, ctx: _Run, clip: _Clip, seg: Segment) -> None:
        self.paths = {k: _side_file(ctx, clip, seg, f"vmaf_{k}.y") for k in ("out", "gt")}
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




def _write_compare(ctx: _Run, clip: _Clip, seg: Segment, name: str, lq: torch.Tensor, out: torch.Tensor,
                   gt: torch.Tensor | None) -> dict[str, Any]:
    """The report's comparison frame of a clip: input (upscaled) | output | GT as PNG files beside the marker."""
    files = {}
    for panel, rgb in comparison_panels(lq, out, gt).items():
        path = _side_file(ctx, clip, seg, f"compare_{panel}.png")
        with atomic_open(path, "wb") as f:  # a temporary that ResultStore.clear_temporaries removes after a crash
            f.write(encode_png(rgb))
        files[panel] = os.path.basename(path)
    return {"frame": name, "files": files}


def _row(values: dict[str, float], names: Sequence[str]) -> list[float | None]:
    return [values.get(n) for n in names]


def _restore_segment(ctx: _Run, clip: _Clip, seg: Segment, outputs: Iterator[torch.Tensor],
                     gt: Iterator[torch.Tensor] | None, bar: Any) -> dict[str, Any]:
    args, store = ctx.args, ctx.store
    assert seg.stop is not None and clip.lazy is not None
    store.clear_temporaries(clip.folder, seg)
    names = clip.names[seg.start: seg.stop]
    columns = [s.name for s in ctx.streamed]
    # one scorer per segment, fed one frame at a time: a segment scores as that stretch of the whole clip does
    scorer = ctx.scoring.stream_scorer(clip.folder) if columns else None
    metrics: list[list[float | None]] | None = [] if columns else None
    keep_edges = bool(ctx.temporal) and seg.parts > 1
    edges: dict[str, np.ndarray] = {}
    spool = _Spool(ctx, clip, seg) if ctx.vmaf else None
    compare = None
    writer: VideoWriter | None = None
    try:
        for offset, name in enumerate(names):
            index = seg.start + offset
            frame = next(outputs)
            if args.save_result:
                imwrite_rgb(os.path.join(ctx.save_dir, clip.folder, f"{name}.png"), frame)
            if args.save_video:
                writer = writer or _segment_writer(ctx, clip, seg, frame)
                writer.write(frame)
            target = None
            if gt is not None:
                target = next(gt, None)
                if target is None:
                    raise ValueError(f"{clip.lazy['H'].name}: the ground truth ends before output frame {name}")
                if target.shape != frame.shape:
                    raise ValueError(f"clip {clip.folder}: output {tuple(frame.shape)} and ground truth "
                                     f"{tuple(target.shape)} differ")
            if scorer is not None and metrics is not None:
                values = scorer.update(frame[None], target[None] if target is not None else None, index)[0]
                metrics.append(_row(values, columns))
            if keep_edges:
                for where in (("head",) if offset == 0 else ()) + (("tail",) if offset == len(names) - 1 else ()):
                    edges[f"{where}_out"] = _u8(frame)
                    if target is not None:
                        edges[f"{where}_gt"] = _u8(target)
            if spool is not None and target is not None:
                spool.add(frame, target)
            if args.report and index == clip.compared:
                lq_frame = _input_frame(clip, index, tiling_kwargs(ctx.setup)["center_frame_only"])
                compare = _write_compare(ctx, clip, seg, name, lq_frame, frame, target)
            ctx.frames_restored += 1
            bar.update(1)
        video = None
        if writer is not None:
            writer.close()
            video = "part" if seg.parts > 1 else writer.path
        edges_file = None
        if keep_edges:
            path = _side_file(ctx, clip, seg, "edges.npz")
            with atomic_open(path, "wb") as f:
                np.savez_compressed(f, **edges)
            edges_file = os.path.basename(path)
        spooled = spool.close() if spool is not None else None
    except BaseException:
        if writer is not None:
            writer.abort()
        if spool is not None:
            spool.abort()
        raise
    return store.write(clip.folder, seg, {"frames": clip.frames, "names": names, "metric_names": columns,
                                          "metrics": metrics, "png": bool(args.save_result), "video": video,
                                          "edges": edges_file, "vmaf_spool": spooled, "compare": compare,
                                          "rank": ctx.rank, "uid": uuid.uuid4().hex})


def _segment_writer(ctx: _Run, clip: _Clip, seg: Segment, frame: torch.Tensor) -> VideoWriter:
    """The clip's video for a clip in one segment; else a lossless part, assembled when every part is done."""
    assert clip.lazy is not None
    if seg.parts > 1:
        return VideoWriter(ctx.store.part_path(clip.folder, seg), clip.lazy.get("fps", 25))
    ctx.store.clear_temporaries(clip.folder, None)
    return clip_video_writer(ctx.save_dir, clip.folder, frame.shape[-2], frame.shape[-1], clip.lazy.get("fps", 25),
                             audio_from=clip.lazy.get("video_path"), **_codec(ctx))


def _unbatch(batch: list[dict[str, Any]]) -> dict[str, Any]:
    """The item of a batch of one (items differ in size)."""
    return batch[0]


def _restore_whole(ctx: _Run, segments: list[Segment]) -> None:
    """Test items restored at once (Vimeo-90K-T, interpolation sets), loaded by ``--num_workers`` workers."""
    args, setup = ctx.args, ctx.setup
    loader = DataLoader(Subset(ctx.test_set, [seg.clip for seg in segments]), batch_size=1, shuffle=False,
                        num_workers=args.num_workers, collate_fn=_unbatch,
                        worker_init_fn=ignore_stop_signals)
    for seg, item in zip(segments, tqdm(loader, desc="Testing", unit="clip", disable=ctx.rank != 0)):
        clip = ctx.clips[seg.clip]
        folder = str(item["folder"])
        out = restore_clip(setup, item, ctx.device, ctx.amp, ctx.vimeo)
        paths = item.get("gt_path") if (setup.vfi or ctx.vimeo) else item.get("lq_path")
        names = frame_names(paths if paths is not None else item.get("lq_path"), out.shape[0])
        ctx.store.clear_temporaries(folder, seg)
        if args.save_result:
            for name, frame in zip(names, out):
                imwrite_rgb(os.path.join(ctx.save_dir, folder, f"{name}.png"), frame)
        video = None
        if args.save_video:
            ctx.store.clear_temporaries(folder, None)
            video = write_clip_video(ctx.save_dir, folder, out, item.get("fps", 25), audio_from=item.get("video_path"),
                                     **_codec(ctx))
        gt = item.get("H")
        gt = gt[: out.shape[0]] if gt is not None else None
        columns = [s.name for s in ctx.scoring.specs]
        metrics, pooled = None, None
        if columns:
            use = ctx.scoring if gt is not None else ctx.scoring.no_reference()
            try:
                frames, values = use.score_clip(out, gt, folder) if use is not None else ([], {})
            except ValueError as exc:
                raise ValueError(f"clip {folder}: {exc}") from exc
            metrics = [_row(f, columns) for f in frames]
            pooled = {s.name: values[s.name] for s in ctx.scoring.specs if not s.per_frame and s.name in values}
        compare = None
        if args.report:
            t = out.shape[0] // 2
            lq_up = input_baseline(item["L"][None], out[None])[0]
            compare = _write_compare(ctx, clip, seg, names[t], lq_up[min(t, lq_up.shape[0] - 1)], out[t],
                                     gt[t] if gt is not None else None)
        ctx.frames_restored += out.shape[0]
        ctx.records[(seg.clip, seg.key)] = ctx.store.write(
            folder, seg, {"frames": 0, "names": names, "metric_names": columns, "metrics": metrics,
                          "pooled": pooled, "png": bool(args.save_result), "video": video, "compare": compare,
                          "rank": ctx.rank, "uid": uuid.uuid4().hex})
        _print_ready(ctx)


def _codec(ctx: _Run) -> dict[str, Any]:
    """``--video_codec``/``--video_crf`` as keyword arguments of the clip video writers."""
    return {"codec": ctx.args.video_codec, "crf": ctx.args.video_crf}


def _assemble_videos(ctx: _Run) -> None:
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
                                                             audio_from=clip.lazy.get("video_path"), **_codec(ctx))
                        writer.write(frame)
            assert writer is not None
            writer.close()
        except BaseException:
            if writer is not None:
                writer.abort()
            raise
        ctx.store.mark_video(clip.folder, writer.path, parts)


# ------------------------------------------------------------------------------------- joining a clip's segments
def _finish_clips(ctx: _Run) -> None:
    """The per-clip scores that need every segment of a clip (border terms, VMAF), clips shared out over ranks."""
    for position, clip in enumerate(ctx.clips):
        if position % ctx.world == ctx.rank:
            _finish_clip(ctx, clip)


def _finish_clip(ctx: _Run, clip: _Clip) -> None:
    """Border terms of the temporal metrics at each later segment's first frame, and the clip's VMAF (recorded in
    ``.eval_state/<clip>/vmaf.json``, then its spools removed). Once per clip."""
    if clip.index in ctx.finals or clip.lazy is None:
        return
    final: dict[str, Any] = {"border": {}, "vmaf": None}
    records = [ctx.records[(seg.clip, seg.key)] for seg in clip.segments]
    if ctx.temporal and len(clip.segments) > 1:
        temporal = ctx.scoring.temporal_scoring()
        assert temporal is not None
        before = None
        for seg, record in zip(clip.segments, records):
            path = os.path.join(os.path.dirname(_side_file(ctx, clip, seg, "x")), str(record["edges"]))
            with np.load(path) as edges:
                if before is not None:
                    final["border"][seg.start] = temporal.border(before, (edges["head_out"], edges["head_gt"]),
                                                                 seg.start, clip.folder)
                before = (edges["tail_out"], edges["tail_gt"])
    if ctx.vmaf:
        final["vmaf"] = _clip_vmaf(ctx, clip, records)
    ctx.finals[clip.index] = final


def _clip_vmaf(ctx: _Run, clip: _Clip, records: list[dict[str, Any]]) -> dict[str, Any]:
    """A streamed clip's VMAF over all its frames: from ``vmaf.json`` when it was scored from these very segments,
    else from their spools (then recorded, and the spools removed)."""
    uids = [r["uid"] for r in records]
    done = ctx.store.clip_record(clip.folder, "vmaf.json")
    if done is not None and done.get("uids") == uids:
        return {"frames": done["frames"], "pooled": done["pooled"]}
    seg_files = []
    for seg, record in zip(clip.segments, records):
        spool = record["vmaf_spool"]
        folder = os.path.dirname(_side_file(ctx, clip, seg, "x"))
        seg_files.append(({k: os.path.join(folder, spool[k]) for k in ("out", "gt")}, tuple(spool["shape"])))

    def planes(which: str) -> Iterator[np.ndarray]:
        for files, (h, w) in seg_files:
            data = np.fromfile(files[which], dtype=np.uint8)
            yield from data.reshape(-1, h, w)

    frames, pooled = vmaf_clip(planes("out"), planes("gt"), threads=torch.get_num_threads())
    ctx.store.write_clip_record(clip.folder, "vmaf.json", {"uids": uids, "frames": frames, "pooled": pooled})
    for files, _ in seg_files:
        for path in files.values():
            if os.path.exists(path):
                os.remove(path)
    return {"frames": frames, "pooled": pooled}


@dataclass
class _ClipResult:
    folder: str
    names: list[str]
    frames: list[dict[str, float]]  # per output frame
    values: dict[str, float]  # the clip's value of each metric


def _clip_result(ctx: _Run, clip: _Clip) -> _ClipResult:
    """A clip's frames and values, from its segments' records and the clip-level scores (border terms, VMAF)."""
    records = [ctx.records[(seg.clip, seg.key)] for seg in clip.segments]
    folder = str(records[0]["folder"])
    names = [n for r in records for n in r["names"]]
    frames: list[dict[str, float]] = []
    pooled: dict[str, float] = {}
    for record in records:
        columns = record.get("metric_names") or []
        for row in record.get("metrics") or [[] for _ in record["names"]]:
            frames.append({k: v for k, v in zip(columns, row) if v is not None})
        pooled.update(record.get("pooled") or {})
    final = ctx.finals.get(clip.index) or {}
    first = clip.segments[0].start if clip.lazy is not None else 0
    for index, values in (final.get("border") or {}).items():
        frames[int(index) - first].update(values)
    if final.get("vmaf"):
        for i, value in enumerate(final["vmaf"]["frames"]):
            frames[i]["vmaf"] = value
        pooled["vmaf"] = final["vmaf"]["pooled"]
    wanted = {s.name for s in ctx.scoring.specs}
    frames = [{k: v for k, v in f.items() if k in wanted} for f in frames]
    return _ClipResult(folder, names, frames, clip_values(frames, ctx.scoring.specs, pooled))


def _report(ctx: _Run) -> dict[str, float] | None:
    """Rank 0: the clip lines not logged yet, metrics.csv, clips.csv, report.html and the average (as a
    single-process run has them)."""
    specs = ctx.scoring.specs
    results = [_clip_result(ctx, clip) for clip in ctx.clips]
    for clip, result in zip(ctx.clips, results):
        if clip.index >= ctx.printed:
            for line in testing_lines(result.folder, clip.index, len(ctx.clips), result.values, specs):
                logger.info("%s", line)
    ctx.printed = len(ctx.clips)
    scored = [r for r in results if r.values]
    average = mean_over_clips([r.values for r in scored], specs)
    if scored:
        columns = [s.name for s in frame_columns(specs)]
        _write_csv(os.path.join(ctx.save_dir, "metrics.csv"), ["folder", "frame", *columns],
                   [[r.folder, name, *(f.get(c) for c in columns)] for r in scored
                    for name, f in zip(r.names, r.frames)])
        _write_csv(os.path.join(ctx.save_dir, "clips.csv"), ["folder", "frames", *(s.name for s in specs)],
                   [[r.folder, len(r.names), *(r.values.get(s.name) for s in specs)] for r in scored])
    if ctx.args.report:
        path = _write_html(ctx, results, average)
        logger.info("Report: %s", path)
    if not average:
        return None
    lines = average_lines(average, specs)
    logger.info("\n%s \n-- %s", ctx.save_dir, lines[0])
    for line in lines[1:]:
        logger.info("-- %s", line)
    return average


def _write_html(ctx: _Run, results: list[_ClipResult], average: dict[str, float]) -> str:
    clips = []
    for clip, result in zip(ctx.clips, results):
        report = ClipReport(result.folder, result.names, result.frames, result.values)
        for seg in clip.segments:
            compare = ctx.records[(seg.clip, seg.key)].get("compare")
            if compare:
                folder = os.path.dirname(_side_file(ctx, clip, seg, "x"))
                for panel, name in compare["files"].items():
                    with open(os.path.join(folder, name), "rb") as f:
                        report.images[panel] = f.read()
                report.frame = compare["frame"]
        clips.append(report)
    about = [f"model {ctx.setup.name}", f"input {ctx.args.folder_lq}",
             f"ground truth {ctx.args.folder_gt}" if ctx.args.folder_gt else "no ground truth",
             f"{len(clips)} clip{'s' if len(clips) != 1 else ''}", time.strftime("%Y-%m-%d %H:%M")]
    return write_report(os.path.join(ctx.save_dir, "report.html"), f"Evaluation of {ctx.setup.name}",
                        ctx.scoring.specs, clips, average, about)


def _write_csv(path: str, header: list[str], rows: list[list[Any]]) -> None:
    """Rows with floats at full precision (an empty cell: no value), written to a temporary name and renamed."""
    with atomic_open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        writer.writerows([[repr(float(v)) if isinstance(v, float) else ("" if v is None else v) for v in r]
                          for r in rows])


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv`` and run (under torchrun: on every rank); returns the process exit code (2 for a missing
    model or input, an unreadable frame or file, ...: one ``error:`` line)."""
    args = build_parser().parse_args(argv)
    try:
        # gloo carries the few small messages of an evaluation; the timeout covers one rank finishing early
        info = utils_dist.init_dist("gloo", timeout_s=float(os.environ.get("VRT_DIST_TIMEOUT") or 86400))
    except utils_dist.DistError as exc:
        logger.error("error: %s", exc)
        return 2
    root = logging.getLogger()
    if info.rank != 0 and root.level < logging.WARNING:
        root.setLevel(logging.WARNING)  # rank 0 speaks for the run
    # a stop signal (SIGTERM from timeout or scancel, Ctrl-C, a hang-up, also when it reaches every process of the
    # job at once) ends the run where it is: the complete segments keep their markers, a re-run finishes the rest
    previous = install_stop_handler(_stop_now)
    try:
        with logging_redirect_tqdm():  # a warning during a clip gets a line of its own, not the progress bar's
            run(args)
    except _Stopped as stop:
        logger.warning("Stopped by %s: the complete segments are kept; re-run the same command to finish the rest",
                       stop.signal.name)
        return 128 + int(stop.signal)
    except _Failed:
        return 2
    finally:
        restore_handlers(previous)
        utils_dist.destroy_dist()
    return 0
