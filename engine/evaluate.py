"""The logic of ``main_test_vrt.py``: build a released or trained model, restore test videos, score and save them.

Flag-compatible with the official VRT ``main_test_vrt.py`` and KAIR's ``main_test_rvrt.py`` (``--task``,
``--sigma``, ``--folder_lq``, ``--folder_gt``, ``--tile``, ``--tile_overlap``, ``--num_workers``,
``--save_result``), plus ``--model_path``/``--opt`` for checkpoints of ours, ``--device``, ``--amp``,
``--save_video``, ``--segment_frames`` and ``--no_resume``. Metrics and log lines are the reference's (per-clip
means, then the mean over clips).

Clips of frame folders and video files stream (:func:`models.video_stream.stream_video`): frames are read one at a
time, every output frame is saved and scored as soon as it is final, so host memory is bounded by about one
temporal tile whatever the length. Clips are cut into segments at tile ends (:mod:`engine.eval_jobs`) and the
segments shared out over the ranks of a ``torchrun`` launch; each complete segment leaves a marker, so a re-run
skips what is done. The per-frame metrics travel with the markers; rank 0 prints each clip once and the average
once, equal to a single-process run. Test sets of short items (Vimeo-90K-T, the interpolation sets) are restored an
item at a time, as before.
"""

from __future__ import annotations

import argparse
import csv
import logging
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

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
from engine.scoring import METRICS, average_text, clip_scores, frame_names, mean_scores, testing_line
from models.model_zoo import ModelZooError
from models.video_stream import Prefetch, num_outputs, segment_bounds, stream_video
from utils import utils_checkpoint, utils_dist
from utils.utils_image import imwrite_rgb
from utils.utils_numerics import AMP_DTYPES
from utils.utils_video_file import VideoReader, VideoWriter

logger = logging.getLogger(__name__)

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
    records: dict[tuple[int, str], dict[str, Any]] = field(default_factory=dict)
    frames_restored: int = 0
    printed: int = 0


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


def _prepare(args: argparse.Namespace) -> _Run:
    """Build the network and the test set, plan the segments and share them out (the same on every rank)."""
    rank, world = utils_dist.get_rank(), utils_dist.get_world_size()
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
    return _Run(args, setup, test_set, device, amp, save_dir, vimeo, rank, world, store, clips)


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
    """Test every clip (shared out over the ranks); returns the average metrics (``None`` without ground truth).

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
    mine = [seg for clip in ctx.clips for seg in clip.segments]
    owners = eval_jobs.assign_ranks([seg.weight for seg in mine], ctx.world)
    done_before = 0
    error = None
    try:
        done_before = _restore(ctx, [seg for seg, owner in zip(mine, owners) if owner == ctx.rank])
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
    except USER_ERRORS as exc:
        error = _log_error(ctx.rank, ctx.world, exc)
    _agree(error, logged=True)
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


def _restore(ctx: _Run, segments: list[Segment]) -> int:
    """Restore this rank's segments that are not complete yet; returns how many were."""
    todo, skipped = [], 0
    for seg in segments:
        clip = ctx.clips[seg.clip]
        record = ctx.store.load(None if clip.lazy is None else clip.folder, seg, clip.frames, ctx.args.save_result,
                                ctx.args.save_video)
        if record is None:
            todo.append(seg)
        else:
            ctx.records[(seg.clip, seg.key)] = record
            skipped += 1
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
    """One process: log each clip's line as soon as all its segments are in (several: rank 0 logs at the end)."""
    if ctx.world > 1:
        return
    while ctx.printed < len(ctx.clips) and all((s.clip, s.key) in ctx.records for s in ctx.clips[ctx.printed].segments):
        folder, _, mean = _clip_result(ctx, ctx.clips[ctx.printed])
        logger.info("%s", testing_line(folder, ctx.printed, len(ctx.clips), mean))
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


def _restore_segment(ctx: _Run, clip: _Clip, seg: Segment, outputs: Iterator[torch.Tensor],
                     gt: Iterator[torch.Tensor] | None, bar: Any) -> dict[str, Any]:
    args, store = ctx.args, ctx.store
    assert seg.stop is not None and clip.lazy is not None
    store.clear_temporaries(clip.folder, seg)
    names = clip.names[seg.start: seg.stop]
    metrics: list[list[float]] | None = [] if gt is not None else None
    writer: VideoWriter | None = None
    try:
        for name in names:
            frame = next(outputs)
            if args.save_result:
                imwrite_rgb(os.path.join(ctx.save_dir, clip.folder, f"{name}.png"), frame)
            if args.save_video:
                writer = writer or _segment_writer(ctx, clip, seg, frame)
                writer.write(frame)
            if gt is not None and metrics is not None:
                target = next(gt, None)
                if target is None:
                    raise ValueError(f"{clip.lazy['H'].name}: the ground truth ends before output frame {name}")
                try:
                    scores = clip_scores(frame[None], target[None])[0]
                except ValueError as exc:
                    raise ValueError(f"clip {clip.folder}: {exc}") from exc
                metrics.append([scores[k] for k in METRICS])
            ctx.frames_restored += 1
            bar.update(1)
        video = None
        if writer is not None:
            writer.close()
            video = "part" if seg.parts > 1 else writer.path
    except BaseException:
        if writer is not None:
            writer.abort()
        raise
    return store.write(clip.folder, seg, {"frames": clip.frames, "names": names, "metrics": metrics,
                                          "png": bool(args.save_result), "video": video, "rank": ctx.rank})


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
                        num_workers=args.num_workers, collate_fn=_unbatch)
    for seg, item in zip(segments, tqdm(loader, desc="Testing", unit="clip", disable=ctx.rank != 0)):
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
        metrics = None
        gt = item.get("H")
        if gt is not None:
            try:
                frames = clip_scores(out, gt[: out.shape[0]])
            except ValueError as exc:
                raise ValueError(f"clip {folder}: {exc}") from exc
            metrics = [[m[k] for k in METRICS] for m in frames]
        ctx.frames_restored += out.shape[0]
        ctx.records[(seg.clip, seg.key)] = ctx.store.write(
            folder, seg, {"frames": 0, "names": names, "metrics": metrics, "png": bool(args.save_result),
                          "video": video, "rank": ctx.rank})
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


def _clip_result(ctx: _Run, clip: _Clip) -> tuple[str, list[list[Any]], dict[str, float] | None]:
    """A clip's name, metrics.csv rows and mean metrics (``None`` without GT), from its segments' records."""
    records = [ctx.records[(seg.clip, seg.key)] for seg in clip.segments]
    folder = str(records[0]["folder"])
    if any(r["metrics"] is None for r in records):
        return folder, [], None
    rows = [[folder, name, *values] for r in records for name, values in zip(r["names"], r["metrics"])]
    return folder, rows, mean_scores([dict(zip(METRICS, row[2:])) for row in rows])


def _report(ctx: _Run) -> dict[str, float] | None:
    """Rank 0: the clip lines not logged yet, metrics.csv and the average (as a single-process run has them)."""
    clip_means: list[dict[str, float]] = []
    rows: list[list[Any]] = []
    for clip in ctx.clips:
        folder, clip_rows, mean = _clip_result(ctx, clip)
        if clip.index >= ctx.printed:
            logger.info("%s", testing_line(folder, clip.index, len(ctx.clips), mean))
        if mean is not None:
            clip_means.append(mean)
            rows += clip_rows
    ctx.printed = len(ctx.clips)
    if not clip_means:
        return None
    average = mean_scores(clip_means)
    _write_csv(os.path.join(ctx.save_dir, "metrics.csv"), rows)
    logger.info("\n%s \n-- %s", ctx.save_dir, average_text(average))
    return average


def _write_csv(path: str, rows: list[list[Any]]) -> None:
    """One row per frame, full precision; written to a temporary name and renamed."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["folder", "frame", *METRICS])
        writer.writerows([r[:2] + [repr(float(v)) for v in r[2:]] for r in rows])
    os.replace(tmp, path)


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
    try:
        with logging_redirect_tqdm():  # a warning during a clip gets a line of its own, not the progress bar's
            run(args)
    except _Failed:
        return 2
    finally:
        utils_dist.destroy_dist()
    return 0
