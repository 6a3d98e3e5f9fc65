"""The bookkeeping of ``main_test_vrt.py``: segments of clips, their share-out over ranks, completion markers.

A test clip is restored as one or more *segments* (consecutive output frames cut at temporal tile ends, see
:func:`models.video_stream.segment_bounds`), so that a long video can be split over processes and an interrupted
run resumed, with outputs bit-identical to one uninterrupted single-process run. The segments, in clip order, are
dealt out to the ranks in contiguous runs of about equal frame counts, so each process streams through neighbouring
segments without recomputing the clip they share.

A segment is complete when its *marker* exists, ``<save_dir>/.eval_state/<clip>/<start>-<stop>.json``
(``.eval_state/_items/<index>.json`` for a test item restored at once), written atomically (temporary file, then
``os.replace``) after its frames, video part and metrics. The marker holds the frame names and the per-frame
metrics by name (floats written exactly), a fingerprint of everything that decides the outputs (network and weights
file, tiles, inputs, noise, precision, device type) and which outputs were written. Files a segment leaves beside
its marker for the metrics (``<start>-<stop>.edges.npz``: its first and last frames; ``.vmaf_out.y``/``.vmaf_gt.y``:
luma planes for the clip's VMAF; ``.compare_*.png``: the report's comparison frame) are named in it. A marker of
another command, an unreadable one, or one whose outputs are gone does not count: the segment is restored again.
"""

from __future__ import annotations

import glob
import hashlib
import json
import logging
import math
import os
import resource
from dataclasses import dataclass
from typing import Any

import torch

from utils.utils_fs import atomic_open

logger = logging.getLogger(__name__)

STATE_DIR = ".eval_state"
MARKER_VERSION = 2  # 2: per-frame metrics by name, boundary frames, VMAF spools, the report's comparison frame


@dataclass(frozen=True)
class Segment:
    """Output frames ``[start, stop)`` of test item ``clip``; ``stop is None`` for an item restored whole.

    Attributes:
        clip: index of the item in the test set.
        start, stop: output frames.
        part, parts: position of the segment in its clip, and the clip's number of segments.
    """

    clip: int
    start: int
    stop: int | None
    part: int
    parts: int

    @property
    def weight(self) -> int:
        """The work it stands for: output frames (1 for a whole item)."""
        return 1 if self.stop is None else self.stop - self.start

    @property
    def key(self) -> str:
        return f"item{self.clip}" if self.stop is None else f"{self.start}-{self.stop}"


def assign_ranks(weights: list[int], world: int) -> list[int]:
    """The rank of each item: contiguous runs of about ``sum(weights) / world`` each, in order.

    An item goes to the rank whose share holds the middle of its span on the cumulative axis, so ranks get
    neighbouring items and the share-out depends on nothing but the weights and the world size.
    """
    total = sum(weights)
    owners, before = [], 0
    for weight in weights:
        middle = before + weight / 2
        owners.append(min(world - 1, int(middle * world / total)) if total else 0)
        before += weight
    return owners


def segment_target(requested: int, total_frames: int, world: int) -> int:
    """Segment length: ``--segment_frames``, shortened so that every rank can get some work."""
    return max(1, min(requested, math.ceil(total_frames / max(world, 1))))


def fingerprint(settings: dict[str, Any]) -> str:
    """A short hash of what decides the outputs (a weights file stands for its path, size and mtime)."""
    return hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest()[:20]


def file_identity(path: str) -> dict[str, Any]:
    """``{path, size, mtime_ns}`` of a file (what a re-run must find unchanged to reuse results)."""
    stat = os.stat(path)
    return {"path": os.path.abspath(path), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}


class ResultStore:
    """Completion markers and temporary video parts under ``<save_dir>/.eval_state``.

    Args:
        save_dir: the output folder.
        fingerprint: :func:`fingerprint` of the run's settings.
        resume: use the markers found (``False``: restore everything again).
    """

    def __init__(self, save_dir: str, fingerprint: str, resume: bool = True) -> None:
        self.save_dir = save_dir
        self.root = os.path.join(save_dir, STATE_DIR)
        self.fingerprint = fingerprint
        self.resume = resume
        self.stale = 0

    def _dir(self, folder: str | None, segment: Segment | None = None) -> str:
        if segment is not None and segment.stop is None:
            return os.path.join(self.root, "_items")  # item folders need not be unique (interpolation sets)
        return os.path.join(self.root, str(folder))

    def _stem(self, segment: Segment) -> str:
        return str(segment.clip) if segment.stop is None else segment.key

    def marker_path(self, folder: str | None, segment: Segment) -> str:
        return os.path.join(self._dir(folder, segment), f"{self._stem(segment)}.json")

    def side_path(self, folder: str | None, segment: Segment, what: str) -> str:
        """A file a segment keeps beside its marker: ``<stem>.<what>``."""
        return os.path.join(self._dir(folder, segment), f"{self._stem(segment)}.{what}")

    def clip_record(self, folder: str, name: str) -> dict[str, Any] | None:
        """A clip-level record (``vmaf.json``) written by this command (same fingerprint), else ``None``."""
        try:
            with open(os.path.join(self._dir(folder), name), encoding="utf-8") as f:
                record = json.load(f)
        except (OSError, ValueError):
            return None
        return record if record.get("fingerprint") == self.fingerprint else None

    def write_clip_record(self, folder: str, name: str, record: dict[str, Any]) -> None:
        """Write a clip-level record atomically."""
        write_json(os.path.join(self._dir(folder), name), {"fingerprint": self.fingerprint, **record})

    def part_path(self, folder: str, segment: Segment) -> str:
        """The lossless video part of a segment of a clip in several segments (``--save_video``)."""
        return os.path.join(self._dir(folder), f"{segment.key}.mkv")

    def load(self, folder: str | None, segment: Segment, frames: int, png: bool,
             video: bool) -> dict[str, Any] | None:
        """The marker of a complete segment, or ``None`` when it has to be restored.

        Args:
            folder: the clip's name (``None`` for an item restored whole: the marker names it).
            segment: the segment.
            frames: the clip's input frame count (a changed input invalidates the marker).
            png, video: the outputs this run writes (``--save_result``, ``--save_video``).
        """
        if not self.resume:
            return None
        path = self.marker_path(folder, segment)
        try:
            with open(path, encoding="utf-8") as f:
                record = json.load(f)
        except FileNotFoundError:
            return None
        except (OSError, ValueError):
            logger.warning("%s: unreadable marker, the segment is restored again", path)
            return None
        if (record.get("version") != MARKER_VERSION or record.get("fingerprint") != self.fingerprint
                or record.get("frames") != frames or (folder is not None and record.get("folder") != folder)):
            self.stale += 1
            return None
        folder = str(record.get("folder"))
        if png and not (record.get("png") and self._pngs_exist(folder, record["names"])):
            return None
        if video and not self._video_exists(folder, segment, record):
            return None
        return record

    def _pngs_exist(self, folder: str, names: list[str]) -> bool:
        return all(os.path.isfile(os.path.join(self.save_dir, folder, f"{name}.png")) for name in names)

    def _video_exists(self, folder: str, segment: Segment, record: dict[str, Any]) -> bool:
        if segment.parts == 1:
            return bool(record.get("video")) and os.path.isfile(str(record["video"]))
        return record.get("video") == "part" and (os.path.isfile(self.part_path(folder, segment))
                                                  or self.video_done(folder) is not None)

    def write(self, folder: str, segment: Segment, record: dict[str, Any]) -> dict[str, Any]:
        """Write a segment's marker atomically (call it after its outputs are written); returns the record."""
        record = {"version": MARKER_VERSION, "fingerprint": self.fingerprint, "folder": folder,
                  "segment": segment.key, **record}
        write_json(self.marker_path(folder, segment), record)
        return record

    def video_done(self, folder: str) -> str | None:
        """The assembled video of a clip in several segments, when it is complete."""
        try:
            with open(os.path.join(self._dir(folder), "video.json"), encoding="utf-8") as f:
                record = json.load(f)
        except (OSError, ValueError):
            return None
        path = record.get("path")
        if record.get("fingerprint") != self.fingerprint or not path or not os.path.isfile(path):
            return None
        return str(path)

    def mark_video(self, folder: str, path: str, parts: list[str]) -> None:
        """Record an assembled clip video, then remove its parts."""
        write_json(os.path.join(self._dir(folder), "video.json"), {"fingerprint": self.fingerprint, "path": path})
        for part in parts:
            if os.path.exists(part):
                os.remove(part)

    def clear_temporaries(self, folder: str, segment: Segment | None) -> None:
        """Remove what an interrupted writer left behind: the temporaries of a segment's marker and part, or
        (``segment=None``) of the clip's video. Only the rank that writes those files calls this."""
        if segment is None:
            where, prefix = os.path.dirname(os.path.join(self.save_dir, folder)), f"{os.path.basename(folder)}.m"
        else:
            where, prefix = self._dir(folder, segment), f"{self._stem(segment)}."
        for path in glob.glob(os.path.join(glob.escape(where), f".{glob.escape(prefix)}*.tmp*")):
            try:
                os.remove(path)
            except OSError:
                pass


def write_json(path: str, data: dict[str, Any]) -> None:
    """Write ``data`` to ``path`` atomically (a reader sees the old file, or the complete new one), durably (the
    file and the rename are fsynced)."""
    with atomic_open(path, "w", durable=True, encoding="utf-8") as f:
        json.dump(data, f)


def peak_host_bytes() -> int:
    """The peak resident memory of this process (Linux reports it in KiB)."""
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def peak_device_bytes(device: torch.device) -> int | None:
    """Peak memory allocated by PyTorch on a CUDA device, ``None`` elsewhere."""
    if device.type != "cuda":
        return None
    return int(torch.cuda.max_memory_allocated(device))
