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

This module runs the phases and restores the segments (saving and scoring each frame as it comes); the run's
preparation and plan are in :mod:`engine.eval_run`, the files beside the markers and the clip videos in
:mod:`engine.eval_writers`, the joined clip scores, log lines, tables and report in :mod:`engine.eval_results`.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import time
import uuid
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Subset
from tqdm import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

from engine import eval_jobs
from engine.eval_jobs import Segment
from engine.eval_results import finish_clips, log_ready_clips, write_results
from engine.eval_run import EvalClip, EvalRun, plan, prepare, side_file
from engine.eval_setup import TestSetup, build_parser, build_test_set, restore_clip, setup_model, tiling_kwargs
from engine.eval_writers import Spool, assemble_videos, codec, input_frame, segment_writer, u8, write_compare
from engine.scoring import frame_names
from engine.validate import input_baseline
from models.model_zoo import ModelZooError
from models.video_stream import Prefetch, stream_video
from utils import utils_checkpoint, utils_dist
from utils.utils_fs import atomic_open
from utils.utils_image import imwrite_rgb
from utils.utils_signals import ignore_stop_signals, install_stop_handler, restore_handlers
from utils.utils_video_clips import write_clip_video
from utils.utils_video_file import VideoWriter

# what callers (tests, benchmarks, scripts) reach through this module
__all__ = ["TestSetup", "build_parser", "build_test_set", "main", "restore_clip", "run", "setup_model"]

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


def run(args: argparse.Namespace) -> dict[str, float] | None:
    """Test every clip (shared out over the ranks); returns the average metrics (``None`` when nothing was scored).

    Raises:
        _Failed: a rank failed; the reason has been logged once.
    """
    ctx = None
    try:
        ctx = prepare(args)
        error = None
    except USER_ERRORS as exc:
        error = str(exc)
    _agree(error, logged=False)
    assert ctx is not None
    started = time.perf_counter()
    todo = plan(ctx)
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
        assemble_videos(ctx)
        finish_clips(ctx)
    except USER_ERRORS as exc:
        error = _log_error(ctx.rank, ctx.world, exc)
    _agree(error, logged=True)
    for finals in utils_dist.all_gather_object(ctx.finals):
        ctx.finals.update(finals)
    if ctx.rank != 0:
        return None
    average = write_results(ctx)
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


# ----------------------------------------------------------------------------------------------- restoration
def _restore(ctx: EvalRun, segments: list[Segment]) -> int:
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
    log_ready_clips(ctx)
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
            log_ready_clips(ctx)
    if whole:
        _restore_whole(ctx, whole)
    return skipped


def _restore_stream(ctx: EvalRun, clip: EvalClip, segments: list[Segment]) -> None:
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


def _row(values: dict[str, float], names: Sequence[str]) -> list[float | None]:
    return [values.get(n) for n in names]


def _restore_segment(ctx: EvalRun, clip: EvalClip, seg: Segment, outputs: Iterator[torch.Tensor],
                     gt: Iterator[torch.Tensor] | None, bar: Any) -> dict[str, Any]:
    """Save, write and score the frames of one segment as ``outputs`` yields them; returns its marker's record."""
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
    spool = Spool(ctx, clip, seg) if ctx.vmaf else None
    compare = None
    writer: VideoWriter | None = None
    try:
        for offset, name in enumerate(names):
            index = seg.start + offset
            frame = next(outputs)
            if args.save_result:
                imwrite_rgb(os.path.join(ctx.save_dir, clip.folder, f"{name}.png"), frame)
            if args.save_video:
                writer = writer or segment_writer(ctx, clip, seg, frame)
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
                    edges[f"{where}_out"] = u8(frame)
                    if target is not None:
                        edges[f"{where}_gt"] = u8(target)
            if spool is not None and target is not None:
                spool.add(frame, target)
            if args.report and index == clip.compared:
                lq_frame = input_frame(clip, index, tiling_kwargs(ctx.setup)["center_frame_only"])
                compare = write_compare(ctx, clip, seg, name, lq_frame, frame, target)
            ctx.frames_restored += 1
            bar.update(1)
        video = None
        if writer is not None:
            writer.close()
            video = "part" if seg.parts > 1 else writer.path
        edges_file = None
        if keep_edges:
            path = side_file(ctx, clip, seg, "edges.npz")
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


def _unbatch(batch: list[dict[str, Any]]) -> dict[str, Any]:
    """The item of a batch of one (items differ in size)."""
    return batch[0]


def _restore_whole(ctx: EvalRun, segments: list[Segment]) -> None:
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
                                     **codec(ctx))
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
            compare = write_compare(ctx, clip, seg, names[t], lq_up[min(t, lq_up.shape[0] - 1)], out[t],
                                    gt[t] if gt is not None else None)
        ctx.frames_restored += out.shape[0]
        ctx.records[(seg.clip, seg.key)] = ctx.store.write(
            folder, seg, {"frames": 0, "names": names, "metric_names": columns, "metrics": metrics,
                          "pooled": pooled, "png": bool(args.save_result), "video": video, "compare": compare,
                          "rank": ctx.rank, "uid": uuid.uuid4().hex})
        log_ready_clips(ctx)


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
