"""A run of ``main_test_vrt.py``: what its phases share (:class:`EvalRun`), its preparation (network, test set,
metrics, segments, all checked before any restoration) and the plan of what is left to do (which segments a re-run
finds complete).

The same on every rank: each builds the network and the test set, cuts the clips into segments at tile ends
(:func:`models.video_stream.segment_bounds`) and fingerprints the settings that decide the outputs; rank 0 reads the
segments' markers (:class:`engine.eval_jobs.ResultStore`) and tells every rank which ones are restored.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils.data import Dataset

from engine import eval_jobs
from engine.eval_jobs import ResultStore, Segment
from engine.eval_setup import TestSetup, build_test_set, setup_model, tiling_kwargs
from engine.scoring import MetricError, MetricSpec, Scoring, frame_names, metric_specs
from engine.validate import probe_frames
from models.video_stream import num_outputs, segment_bounds
from utils import utils_dist
from utils.metrics import check_clip_length
from utils.utils_numerics import AMP_DTYPES


@dataclass
class EvalClip:
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
class EvalRun:
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
    clips: list[EvalClip]
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


def prepare(args: argparse.Namespace) -> EvalRun:
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
    return EvalRun(args, setup, test_set, device, amp, save_dir, vimeo, rank, world, store, clips, scoring)


def _check_frame_size(scoring: Scoring, test_set: Dataset, clip: EvalClip, setup: TestSetup) -> None:
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


def _describe(test_set: Dataset, setup: TestSetup) -> list[EvalClip]:
    """Clip-folder and video test sets stream (``lazy_item``); the others are restored an item at a time."""
    lazy_item = getattr(test_set, "lazy_item", None)
    tiling = tiling_kwargs(setup)
    clips = []
    for index in range(len(test_set)):  # type: ignore[arg-type]
        if lazy_item is None:
            clips.append(EvalClip(index, f"{index}", None))
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
        clips.append(EvalClip(index, str(item["folder"]), item, n, names))
    return clips


def _input_name(item: dict[str, Any]) -> str:
    """The input file (or first frame) of a test item, for messages."""
    paths = item.get("lq_path") or [item.get("folder", "")]
    return f"the test input {item.get('video_path') or paths[0]}"


# ---------------------------------------------------------------------------------------------- what is done
def plan(ctx: EvalRun) -> set[tuple[int, str]]:
    """Rank 0 reads every segment's marker and decides which segments are restored (the same answer on every
    rank, before any rank writes one); the records of the complete ones land in ``ctx.records``."""
    decision = None
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
        decision = (records, todo, ctx.store.stale)
    records, todo, ctx.store.stale = utils_dist.broadcast_object(decision)
    ctx.records.update(records)
    return todo


def side_file(ctx: EvalRun, clip: EvalClip, seg: Segment, what: str) -> str:
    """The file ``what`` a segment leaves beside its marker (edges, VMAF spools, comparison frames)."""
    return ctx.store.side_path(None if clip.lazy is None else clip.folder, seg, what)


def _usable(ctx: EvalRun, clip: EvalClip, seg: Segment, record: dict[str, Any]) -> bool:
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


def _exists(ctx: EvalRun, clip: EvalClip, seg: Segment, name: str | None) -> bool:
    return bool(name) and os.path.isfile(os.path.join(os.path.dirname(side_file(ctx, clip, seg, "x")), str(name)))


def _spooled(ctx: EvalRun, clip: EvalClip, record: dict[str, Any]) -> bool:
    seg = next(s for s in clip.segments if s.key == record["segment"])
    spool = record.get("vmaf_spool") or {}
    return all(_exists(ctx, clip, seg, spool.get(k)) for k in ("out", "gt"))


def _holds_compared(clip: EvalClip, seg: Segment) -> bool:
    return seg.stop is None or seg.start <= clip.compared < seg.stop
