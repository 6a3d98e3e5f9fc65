"""The outputs of ``main_test_vrt.py``: a clip's scores joined from its segments, the log lines, ``metrics.csv``,
``clips.csv`` and ``report.html``.

Joining a clip's segments: the temporal terms (tOF, tLP) of each later segment's first frame, computed from the
previous segment's last frame kept beside its marker, and the clip's VMAF over every frame, from the luma planes the
segments spooled (recorded in ``.eval_state/<clip>/vmaf.json``, then the spools removed). Rank 0 then logs each clip
(KAIR's lines first) and the mean over clips, and writes the tables and the report atomically.
"""

from __future__ import annotations

import csv
import logging
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from engine.eval_run import EvalClip, EvalRun, side_file
from engine.report import ClipReport, write_report
from engine.scoring import average_lines, clip_values, frame_columns, mean_over_clips, testing_lines
from utils.metrics.vmaf import vmaf_clip
from utils.utils_fs import atomic_open

logger = logging.getLogger(__name__)


def finish_clips(ctx: EvalRun) -> None:
    """The per-clip scores that need every segment of a clip (border terms, VMAF), clips shared out over ranks."""
    for position, clip in enumerate(ctx.clips):
        if position % ctx.world == ctx.rank:
            _finish_clip(ctx, clip)


def _finish_clip(ctx: EvalRun, clip: EvalClip) -> None:
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
            path = os.path.join(os.path.dirname(side_file(ctx, clip, seg, "x")), str(record["edges"]))
            with np.load(path) as edges:
                if before is not None:
                    final["border"][seg.start] = temporal.border(before, (edges["head_out"], edges["head_gt"]),
                                                                 seg.start, clip.folder)
                before = (edges["tail_out"], edges["tail_gt"])
    if ctx.vmaf:
        final["vmaf"] = _clip_vmaf(ctx, clip, records)
    ctx.finals[clip.index] = final


def _clip_vmaf(ctx: EvalRun, clip: EvalClip, records: list[dict[str, Any]]) -> dict[str, Any]:
    """A streamed clip's VMAF over all its frames: from ``vmaf.json`` when it was scored from these very segments,
    else from their spools (then recorded, and the spools removed)."""
    uids = [r["uid"] for r in records]
    done = ctx.store.clip_record(clip.folder, "vmaf.json")
    if done is not None and done.get("uids") == uids:
        return {"frames": done["frames"], "pooled": done["pooled"]}
    seg_files = []
    for seg, record in zip(clip.segments, records):
        spool = record["vmaf_spool"]
        folder = os.path.dirname(side_file(ctx, clip, seg, "x"))
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
class ClipResult:
    """A clip as the tables and the report show it."""

    folder: str
    names: list[str]
    frames: list[dict[str, float]]  # per output frame
    values: dict[str, float]  # the clip's value of each metric


def _clip_result(ctx: EvalRun, clip: EvalClip) -> ClipResult:
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
    return ClipResult(folder, names, frames, clip_values(frames, ctx.scoring.specs, pooled))


def write_results(ctx: EvalRun) -> dict[str, float] | None:
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
        write_csv(os.path.join(ctx.save_dir, "metrics.csv"), ["folder", "frame", *columns],
                  [[r.folder, name, *(f.get(c) for c in columns)] for r in scored
                   for name, f in zip(r.names, r.frames)])
        write_csv(os.path.join(ctx.save_dir, "clips.csv"), ["folder", "frames", *(s.name for s in specs)],
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


def _write_html(ctx: EvalRun, results: list[ClipResult], average: dict[str, float]) -> str:
    """``report.html`` from the clip results and the comparison frames kept beside the markers; returns its path."""
    clips = []
    for clip, result in zip(ctx.clips, results):
        report = ClipReport(result.folder, result.names, result.frames, result.values)
        for seg in clip.segments:
            compare = ctx.records[(seg.clip, seg.key)].get("compare")
            if compare:
                folder = os.path.dirname(side_file(ctx, clip, seg, "x"))
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


def write_csv(path: str, header: list[str], rows: list[list[Any]]) -> None:
    """Rows with floats at full precision (an empty cell: no value), written to a temporary name and renamed."""
    with atomic_open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        writer.writerows([[repr(float(v)) if isinstance(v, float) else ("" if v is None else v) for v in r]
                          for r in rows])


def log_ready_clips(ctx: EvalRun) -> None:
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
