"""Frame-accurate random access into video files with PyAV: a per-file frame index, cached as JSON, and a reader
that seeks to the keyframe before a clip and decodes forward.

The index of a file is built once by demuxing its packets (no decoding): the presentation timestamps of its
frames (packet ``pts`` sorted, which puts B-frames in display order) and which frames are keyframes. Frame ``i``
of a file is the ``i``-th frame a full decode from its start gives (what :class:`utils.utils_video_file.VideoReader`
yields). Reading frames ``i..j`` seeks to the last keyframe at or before frame ``i`` and decodes forward, keeping
the frames whose ``pts`` are those of ``i..j``: no more than one GOP is decoded before the clip. A file whose
timestamps cannot identify frames (missing or repeated ``pts``, or decode-order ``pts`` on a stream with B-frames,
as AVI stores them) is indexed in *sequential* mode: its clips are decoded from the start of the file (correct,
slower; logged when it is indexed).

The index is cached as ``<cache_dir>/<file name>.<hash of its absolute path>.json`` (written atomically) together
with the file's size and modification time; a cache entry whose file has changed, or that lacks what is asked
(scene-change scores, the decode check), is rebuilt. Decoders run single-threaded, so frames are the same
whatever the machine. Open containers are kept per process (a few, least recently used first out) and never
carried into a forked or spawned loader worker.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import av
import av.filter
import numpy as np

from utils.utils_fs import atomic_open

# the conversion VideoReader applies, so that a frame read here equals the frame a full decode gives
from utils.utils_video_file import VideoFileError, frame_to_rgb

logger = logging.getLogger(__name__)

__all__ = ["INDEX_DIR_NAME", "INDEX_VERSION", "RUN_INDEX_DIR", "FrameIndex", "VideoClipReader", "default_index_dir",
           "index_cache_path", "load_index", "scan_video"]

INDEX_VERSION = 1
INDEX_DIR_NAME = ".vrt_index"  # a dataset built outside a run: the cache beside the videos
RUN_INDEX_DIR = "video_index"  # a dataset built by training: experiments/<task>/video_index
MAX_OPEN = 4  # containers kept open per process (per dataset)
CROP_MARGIN = 16  # pixels kept around a window while it is converted (the bicubic chroma filter reads about 4)
CROP_ALIGN = 4  # window offsets are multiples of this (chroma subsampling up to 4:1:1 / 4:1:0 stays aligned)
_HIST_SIZE = (36, 64)  # (h, w) the frames are shrunk to for the scene-change histograms
_HIST_BINS = 16
_HIST_SHIFT = 4  # 8-bit levels -> _HIST_BINS bins


@dataclass
class FrameIndex:
    """Where the frames of one video file are.

    Attributes:
        path: the file.
        size, mtime_ns: the file's size and modification time when it was indexed (the cache's validity check).
        width, height: frame size of the first video stream.
        num_frames: frames a full decode gives.
        pts: ``(num_frames,)`` int64 presentation timestamps in display order, or ``None`` (sequential mode).
        keyframes: ``(K,)`` int64 display indices of the keyframes, sorted.
        scene_diff: ``(num_frames,)`` float32 histogram distance in [0, 1] between frame ``t`` and ``t - 1``
            (0 for frame 0), or ``None`` when not computed.
        checked: whether the first and last frames were decoded (and seeking to the last one verified).
    """

    path: str
    size: int
    mtime_ns: int
    width: int
    height: int
    num_frames: int
    pts: np.ndarray | None
    keyframes: np.ndarray
    scene_diff: np.ndarray | None = None
    checked: bool = False

    def to_json(self) -> dict[str, Any]:
        return {"version": INDEX_VERSION, "path": os.path.abspath(self.path), "size": self.size,
                "mtime_ns": self.mtime_ns, "width": self.width, "height": self.height, "num_frames": self.num_frames,
                "pts": None if self.pts is None else self.pts.tolist(), "keyframes": self.keyframes.tolist(),
                "scene_diff": None if self.scene_diff is None else [round(float(d), 5) for d in self.scene_diff],
                "checked": self.checked}

    @classmethod
    def from_json(cls, path: str, data: dict[str, Any]) -> FrameIndex:
        """The index stored by :meth:`to_json` (``path`` is the file as the caller names it).

        Raises:
            KeyError, TypeError, ValueError: a malformed or older entry.
        """
        if data["version"] != INDEX_VERSION:
            raise ValueError(f"index version {data['version']}")
        pts = None if data["pts"] is None else np.asarray(data["pts"], dtype=np.int64)
        diff = None if data["scene_diff"] is None else np.asarray(data["scene_diff"], dtype=np.float32)
        index = cls(path, int(data["size"]), int(data["mtime_ns"]), int(data["width"]), int(data["height"]),
                    int(data["num_frames"]), pts, np.asarray(data["keyframes"], dtype=np.int64), diff,
                    bool(data["checked"]))
        if (pts is not None and len(pts) != index.num_frames) or (diff is not None and len(diff) != index.num_frames):
            raise ValueError("inconsistent lengths")
        return index

    def is_fresh(self, stat: os.stat_result) -> bool:
        """Whether the file still has the size and modification time it was indexed with."""
        return self.size == stat.st_size and self.mtime_ns == stat.st_mtime_ns


def _open(path: str) -> av.container.InputContainer:
    try:
        container = av.open(path)
    except (av.FFmpegError, OSError) as e:
        raise VideoFileError(f"{path}: cannot open as a video ({getattr(e, 'strerror', None) or e})") from e
    if not container.streams.video:
        container.close()
        raise VideoFileError(f"{path}: no video stream (audio-only or not a video file)")
    container.streams.video[0].codec_context.thread_count = 1  # deterministic, and workers are the parallelism
    return container



def scan_video(path: str, scene_diff: bool = False, check: bool = True) -> FrameIndex:
    """Build the index of ``path`` by demuxing its packets; optionally decode it to verify it or score scene changes.

    Args:
        path: the video file.
        scene_diff: decode every frame (shrunk) and store the histogram distance of consecutive frames; also
            verifies the frame count.
        check: decode the first and the last frame (the last one by seeking), as a clip read would.

    Raises:
        VideoFileError: an empty or unreadable file, no video stream, no frame, or frames that do not decode
            (the message names the file and why).
    """
    try:
        stat = os.stat(path)
    except OSError as e:
        raise VideoFileError(f"{path}: cannot read ({e.strerror or e})") from e
    if stat.st_size == 0:
        raise VideoFileError(f"{path}: empty file (0 bytes)")
    with _open(path) as container:
        stream = container.streams.video[0]
        width, height = int(stream.codec_context.width), int(stream.codec_context.height)
        reorders = bool(stream.codec_context.has_b_frames)
        stamps, keys = [], []
        try:
            for packet in container.demux(stream):
                if packet.size and not packet.is_discard:  # the discarded ones (edit lists) are never output
                    stamps.append(packet.pts)
                    keys.append(bool(packet.is_keyframe))
        except av.FFmpegError as e:
            raise VideoFileError(f"{path}: cannot read packet {len(stamps)} ({e})") from e
    if not stamps:
        raise VideoFileError(f"{path}: the video stream has zero frames")
    if not (width and height):
        raise VideoFileError(f"{path}: the video stream gives no frame size")
    pts: np.ndarray | None = None
    keyframes = np.zeros(0, dtype=np.int64)
    if None not in stamps:
        raw = np.asarray(stamps, dtype=np.int64)
        # increasing stamps on a stream that may reorder: either no B-frame was used, or the container stores
        # decode-order stamps (AVI); the decoder's first output frames tell
        suspect = reorders and len(raw) > 1 and bool(np.all(np.diff(raw) > 0))
        if len(np.unique(raw)) == len(raw) and not (suspect and not _outputs_in_order(path, raw)):
            order = np.argsort(raw, kind="stable")
            pts, keyframes = raw[order], np.flatnonzero(np.asarray(keys)[order]).astype(np.int64)
    if pts is None:
        logger.info("%s: its timestamps do not identify frames; its clips are decoded from the start of the file "
                    "(remux it to .mp4 or .mkv for seeking)", path)
    index = FrameIndex(path, stat.st_size, stat.st_mtime_ns, width, height, len(stamps), pts, keyframes)
    if scene_diff:
        index.scene_diff = _scene_diff(index)
    if check:
        reader = VideoClipReader(max_open=1)
        try:
            reader.read(index, sorted({0, index.num_frames - 1}))
        finally:
            reader.close()
        index.checked = True
    return index


def _outputs_in_order(path: str, stamps: np.ndarray, frames: int = 16) -> bool:
    """Whether the first ``frames`` decoded frames carry the first of ``stamps`` (sorted), in order."""
    with _open(path) as container:
        got = []
        try:
            for frame in container.decode(container.streams.video[0]):
                got.append(frame.pts)
                if len(got) == frames:
                    break
        except av.FFmpegError as e:
            raise VideoFileError(f"{path}: cannot decode frame {len(got)} ({e})") from e
    return got == np.sort(stamps)[:len(got)].tolist()


def _scene_diff(index: FrameIndex) -> np.ndarray:
    """Histogram distance between consecutive frames (decoding the whole file once). ``(num_frames,)`` float32."""
    diffs, previous, count = [], None, 0
    with _open(index.path) as container:
        try:
            for frame in container.decode(container.streams.video[0]):
                small = frame.to_ndarray(format="rgb24", width=_HIST_SIZE[1], height=_HIST_SIZE[0])
                hist = np.stack([np.bincount(small[..., c].ravel() >> _HIST_SHIFT, minlength=_HIST_BINS)
                                 for c in range(3)]).astype(np.float32) / small[..., 0].size
                diffs.append(0.0 if previous is None else float(np.abs(hist - previous).sum()) / 6)
                previous, count = hist, count + 1
        except av.FFmpegError as e:
            raise VideoFileError(f"{index.path}: cannot decode frame {count} ({e})") from e
    if count != index.num_frames:
        raise VideoFileError(f"{index.path}: decodes to {count} frames but holds {index.num_frames} frame packets")
    return np.asarray(diffs, dtype=np.float32)


def index_cache_path(cache_dir: str, path: str) -> str:
    """The cache file of ``path``'s index: its name plus a hash of its absolute path (names may repeat)."""
    absolute = os.path.abspath(path)
    digest = hashlib.sha1(absolute.encode()).hexdigest()[:16]
    return os.path.join(cache_dir, f"{os.path.basename(absolute)}.{digest}.json")


def load_index(path: str, cache_dir: str | None, scene_diff: bool = False,
               check: bool = True) -> tuple[FrameIndex, bool]:
    """The index of ``path``: from the cache when it is fresh and has what is asked, else built and cached.

    Args:
        path: the video file.
        cache_dir: the cache folder (created when missing); ``None``: no cache.
        scene_diff, check: see :func:`scan_video`.

    Returns:
        ``(index, built)``: ``built`` is whether the file was scanned (no usable cache entry).

    Raises:
        VideoFileError: see :func:`scan_video`.
    """
    try:
        stat = os.stat(path)
    except OSError as e:
        raise VideoFileError(f"{path}: cannot read ({e.strerror or e})") from e
    cache = index_cache_path(cache_dir, path) if cache_dir else None
    if cache and os.path.isfile(cache):
        try:
            with open(cache) as f:
                cached = FrameIndex.from_json(path, json.load(f))
            if cached.is_fresh(stat) and (cached.scene_diff is not None or not scene_diff) and (cached.checked or
                                                                                                not check):
                return cached, False
        except (OSError, KeyError, TypeError, ValueError) as e:
            logger.info("%s: ignoring the unreadable index cache %s (%s)", path, cache, e)
    index = scan_video(path, scene_diff=scene_diff, check=check)
    if cache:
        _write_json(cache, index.to_json())
    return index, True


def _write_json(path: str, data: dict[str, Any]) -> None:
    """Write atomically (:func:`utils.utils_fs.atomic_open`); a cache that cannot be written is skipped."""
    try:
        with atomic_open(path, "w") as f:
            json.dump(data, f, separators=(",", ":"))
    except OSError as e:
        logger.warning("cannot write the frame index cache %s (%s); the index is rebuilt on the next start", path, e)


def default_index_dir(root: str) -> str:
    """Where the index cache of the videos under ``root`` (a folder, a list file or a video) lives when nothing
    names a folder for it: :data:`INDEX_DIR_NAME` beside the videos when that is writable, else
    ``$XDG_CACHE_HOME/vrt/video_index`` (``~/.cache/...``). Training names the run's folder instead
    (``RUN_INDEX_DIR``)."""
    folder = root if os.path.isdir(root) else os.path.dirname(os.path.abspath(root))
    beside = os.path.join(folder, INDEX_DIR_NAME)
    if os.access(beside if os.path.isdir(beside) else folder, os.W_OK):
        return beside
    cache_home = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(cache_home, "vrt", "video_index")


class VideoClipReader:
    """Decodes chosen frames of indexed video files, keeping up to ``max_open`` files open in this process.

    Containers opened before a fork are not used by the child (their file offsets would be shared), and none is
    pickled: a loader worker opens its own on first use.
    """

    def __init__(self, max_open: int = MAX_OPEN) -> None:
        self.max_open = max_open
        self._containers: OrderedDict[str, av.container.InputContainer] = OrderedDict()
        self._pid = os.getpid()
        self._crop: _Window | None = None  # the window of the read in progress

    def __getstate__(self) -> dict[str, Any]:
        return {"max_open": self.max_open}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["max_open"])

    def close(self) -> None:
        """Close the open files of this process."""
        if self._pid == os.getpid():
            for container in self._containers.values():
                container.close()
        self._containers = OrderedDict()
        self._pid = os.getpid()

    def _container(self, path: str, fresh: bool = False) -> av.container.InputContainer:
        if self._pid != os.getpid():  # a forked worker: the parent's containers are not ours to use
            self._containers, self._pid = OrderedDict(), os.getpid()
        container = self._containers.pop(path, None)
        if container is not None and fresh:
            container.close()
            container = None
        if container is None:
            container = _open(path)
        self._containers[path] = container
        while len(self._containers) > self.max_open:
            self._containers.popitem(last=False)[1].close()
        return container

    def read(self, index: FrameIndex, frames: Sequence[int],
             crop: tuple[int, int, int, int] | None = None) -> list[np.ndarray]:
        """Frames ``frames`` (display indices, any order, repeats allowed) of ``index``'s file.

        Args:
            index: the file's index.
            frames: display indices.
            crop: ``(top, left, height, width)``: return only this window of each frame. Only the window (plus a
                margin for the chroma filter) is converted to RGB, which is much faster on large frames; the
                pixels are the same bits as the window of the whole frame's conversion.

        Returns:
            One RGB ``(H, W, 3)`` uint8 array per entry of ``frames``, equal to that frame (or window) of a full
            decode.

        Raises:
            VideoFileError: a frame outside the file, a decoding failure, or frames the file does not hold where
                its index says (the file changed after it was indexed).
        """
        wanted = sorted(set(int(i) for i in frames))
        if not wanted or wanted[0] < 0 or wanted[-1] >= index.num_frames:
            raise VideoFileError(f"{index.path}: frames {wanted[:1]}..{wanted[-1:]} are outside its "
                                 f"{index.num_frames} frames")
        if crop is not None:
            top, left, height, width = crop
            if min(crop) < 0 or not (height and width) or top + height > index.height or left + width > index.width:
                raise VideoFileError(f"{index.path}: the window {crop} (top, left, height, width) is outside its "
                                     f"{index.width}x{index.height} frames")
        self._crop = None if crop is None else _Window(index, crop)
        try:
            got = self._decode(index, wanted)
        except av.FFmpegError as e:
            broken = self._containers.pop(index.path, None)
            if broken is not None:
                broken.close()
            raise VideoFileError(f"{index.path}: cannot decode ({e})") from e
        finally:
            self._crop = None
        missing = [i for i in wanted if i not in got]
        if missing:
            raise VideoFileError(f"{index.path}: frames {missing[:5]} not found where its index puts them (was it "
                                 f"changed after it was indexed?)")
        return [got[int(i)] for i in frames]

    def _decode(self, index: FrameIndex, wanted: list[int]) -> dict[int, np.ndarray]:
        targets, last = set(wanted), wanted[-1]
        out: dict[int, np.ndarray] = {}
        if index.pts is None:  # sequential mode: count the frames of a decode from the start
            container = self._container(index.path, fresh=True)
            for position, frame in enumerate(container.decode(container.streams.video[0])):
                if position in targets:
                    out[position] = self._rgb(index, frame, position)
                if position >= last:
                    break
            return out
        pts = index.pts
        container, start = self._seek(index, wanted[0])
        stream = container.streams.video[0]
        for packet in container.demux(stream):
            if start is not None:  # the first packet after the seek: a keyframe at or before the one asked for?
                if packet.pts is not None and packet.pts > start:
                    container = self._container(index.path, fresh=True)  # landed too late: decode from the start
                    return self._decode_from(container, index, targets, last)
                start = None
            for frame in packet.decode():
                self._keep(index, frame, pts, targets, out)
            if len(out) == len(targets):
                break
        return out

    def _decode_from(self, container: av.container.InputContainer, index: FrameIndex, targets: set[int],
                     last: int) -> dict[int, np.ndarray]:
        out: dict[int, np.ndarray] = {}
        for frame in container.decode(container.streams.video[0]):
            self._keep(index, frame, index.pts, targets, out)
            if len(out) == len(targets):
                break
        return out

    def _seek(self, index: FrameIndex, first: int) -> tuple[av.container.InputContainer, int | None]:
        """Position the file at the last keyframe at or before frame ``first``; returns the container and that
        keyframe's pts (``None``: at the start of a freshly opened file)."""
        assert index.pts is not None
        k = int(np.searchsorted(index.keyframes, first, side="right")) - 1
        if k < 0:
            return self._container(index.path, fresh=True), None
        target = int(index.pts[index.keyframes[k]])
        container = self._container(index.path)
        container.seek(target, backward=True, any_frame=False, stream=container.streams.video[0])
        return container, target

    def _keep(self, index: FrameIndex, frame: av.VideoFrame, pts: np.ndarray, targets: set[int],
              out: dict[int, np.ndarray]) -> None:
        if frame.pts is None:
            return
        position = int(np.searchsorted(pts, frame.pts))
        if position < len(pts) and pts[position] == frame.pts and position in targets:
            out[position] = self._rgb(index, frame, position)

    def _rgb(self, index: FrameIndex, frame: av.VideoFrame, position: int) -> np.ndarray:
        if (frame.width, frame.height) != (index.width, index.height):
            raise VideoFileError(f"{index.path}: frame {position} is {frame.width}x{frame.height} but the video is "
                                 f"{index.width}x{index.height}; the frame size must not change mid-stream")
        return frame_to_rgb(frame) if self._crop is None else self._crop(frame)


class _Window:
    """Converts one window of a clip's frames to RGB: FFmpeg's ``crop`` filter cuts the decoded frame (keeping its
    colour tags and chroma siting) to the window plus :data:`CROP_MARGIN` pixels on each side, at offsets that keep
    the chroma samples aligned; that is converted and the margin cut off. The chroma filter of the conversion reads
    a few samples around each pixel, so inside the margin the bits equal those of converting the whole frame."""

    def __init__(self, index: FrameIndex, crop: tuple[int, int, int, int]) -> None:
        top, left, height, width = crop
        align = CROP_ALIGN
        self.y0, self.x0 = max(top - CROP_MARGIN, 0) // align * align, max(left - CROP_MARGIN, 0) // align * align
        y1 = min(-(-(top + height + CROP_MARGIN) // align) * align, index.height)
        x1 = min(-(-(left + width + CROP_MARGIN) // align) * align, index.width)
        self.size = (y1 - self.y0, x1 - self.x0)
        self.rows = slice(top - self.y0, top - self.y0 + height)
        self.cols = slice(left - self.x0, left - self.x0 + width)
        self.whole = self.size == (index.height, index.width)
        self._graph: tuple[av.filter.Graph, str] | None = None

    def __call__(self, frame: av.VideoFrame) -> np.ndarray:
        if self.whole:
            return np.ascontiguousarray(frame_to_rgb(frame)[self.rows, self.cols])
        key = f"{frame.format.name} {frame.width}x{frame.height}"
        if self._graph is None or self._graph[1] != key:
            graph = av.filter.Graph()
            source = graph.add_buffer(width=frame.width, height=frame.height, format=frame.format,
                                      time_base=frame.time_base or Fraction(1, 25))
            cut = graph.add("crop", f"w={self.size[1]}:h={self.size[0]}:x={self.x0}:y={self.y0}:exact=1")
            source.link_to(cut)
            cut.link_to(graph.add("buffersink"))
            graph.configure()
            self._graph = (graph, key)
        graph = self._graph[0]
        graph.push(frame)
        return np.ascontiguousarray(frame_to_rgb(graph.pull())[self.rows, self.cols])
