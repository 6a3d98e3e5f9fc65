"""Streaming tiled video inference: the rules of :func:`models.video_inference.infer_video` on frames read one at
a time.

A video is restored in temporal clips (``num_frame_testing`` frames, consecutive clips overlapping by
``num_frame_overlapping``), in order, and each output frame is returned as soon as every clip that overlaps it is
done. Host memory therefore holds about one clip of input frames (plus ``prefetch`` frames read ahead) and one clip
of output frames, whatever the length of the video. The output is bit-identical to :func:`infer_video` on the whole
video: the same clips (the official start positions depend on the length, which is why a source states its length
up front), the same spatial patches and blending, the same float32 sums in the same order divided by the same
counts.

On a CUDA device each clip's input goes to the device in one non-blocking copy from pinned memory, its patches are
blended and the overlapping clips summed on the device, and the frames a clip finishes are copied back without
blocking into one pinned buffer, which is read only after the next clip has been queued, so the host scores and
writes frames while the device computes. Nothing in the loop waits for the device otherwise. On the CPU the same
code runs without copies or waits.

Settings that need the whole sequence read it all first (host memory then grows with the length; the output is
still returned frame by frame):

- ``num_frame_testing=0``: the whole video is one network input (mirror-padded in time to the window);
- ``flip_seq``: output frame t averages the forward pass at t with the reversed pass at t, which the tiling of the
  doubled sequence reaches only at its very end;
- frame interpolation (``vfi``): the network maps its D input frames to one frame.

``pad_seq`` (the last frame repeated, its output dropped) and ``center_frame_only`` (only the clips that cover frame
``D // 2`` run) stream.

Segments: ``start``/``stop`` restore output frames ``[start, stop)`` only, running exactly the clips that overlap
them. :func:`segment_bounds` cuts a video at clip ends, so that segments restored apart (on several processes, or
across an interrupted run) concatenate to the whole output bit for bit; each cut costs one clip computed twice.
"""

from __future__ import annotations

import bisect
import logging
import queue
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Protocol

import torch
from torch import Tensor

from models.video_inference import _infer_clip, _Runner, check_tiling_args, infer_video, tile_starts

logger = logging.getLogger(__name__)

__all__ = ["FrameSource", "Prefetch", "TensorFrames", "num_outputs", "segment_bounds", "stream_video", "streams"]


class FrameSource(Protocol):
    """The frames of one video, read in order (implemented in ``data/``: frame folders, video files, noisy GT).

    Attributes:
        name: the folder or file, for error messages.
    """

    name: str

    def __len__(self) -> int:
        """The number of frames."""
        ...

    def frames(self, start: int = 0) -> Iterator[Tensor]:
        """Frames ``start, start + 1, ...`` as ``(C, h, w)`` float32 tensors in [0, 1]."""
        ...


class TensorFrames:
    """A :class:`FrameSource` over a video already in memory.

    Args:
        video: ``(T, C, h, w)``.
        name: for error messages.
    """

    def __init__(self, video: Tensor, name: str = "<tensor>") -> None:
        self.video = video
        self.name = name

    def __len__(self) -> int:
        return int(self.video.shape[0])

    def frames(self, start: int = 0) -> Iterator[Tensor]:
        return iter(self.video[start:])


def streams(num_frame_testing: int, *, vfi: bool = False, flip_seq: bool = False) -> bool:
    """Whether :func:`stream_video` restores these settings clip by clip (else it reads the whole video first)."""
    return bool(num_frame_testing) and not vfi and not flip_seq


def num_outputs(num_frames: int, *, vfi: bool = False, center_frame_only: bool = False) -> int:
    """The number of output frames of a ``num_frames``-frame video (1 for VFI or ``center_frame_only``)."""
    return 1 if vfi or center_frame_only else num_frames


def segment_bounds(num_frames: int, target: int, *, num_frame_testing: int, num_frame_overlapping: int,
                   pad_seq: bool = False, vfi: bool = False, flip_seq: bool = False,
                   center_frame_only: bool = False) -> list[tuple[int, int]]:
    """Cut the output frames into consecutive ``[start, stop)`` segments of at most about ``target`` frames.

    Cuts fall on the ends of the temporal clips, so a segment shares one clip with each neighbour (none when the
    overlap is 0); a segment is longer than ``target`` only when the clips are. Settings that do not stream, and
    ``center_frame_only``, give one segment.

    Args:
        num_frames: input frames of the video.
        target: wanted segment length in output frames (>= 1).
        num_frame_testing, num_frame_overlapping, pad_seq, vfi, flip_seq, center_frame_only: as in
            :func:`stream_video`.
    """
    n_out = num_outputs(num_frames, vfi=vfi, center_frame_only=center_frame_only)
    if n_out <= target or center_frame_only or not streams(num_frame_testing, vfi=vfi, flip_seq=flip_seq):
        return [(0, n_out)]
    length = num_frames + int(pad_seq)
    clip = min(num_frame_testing, length)
    ends = sorted({s + clip for s in tile_starts(length, num_frame_testing, num_frame_overlapping)[:-1]})
    cuts = [c for c in ends if 0 < c < n_out]
    bounds, start = [], 0
    while start < n_out:
        stop = n_out
        if n_out - start > target:
            first_after = bisect.bisect_right(cuts, start)  # cuts are sorted: no scan of every clip per segment
            last_fitting = bisect.bisect_right(cuts, start + target) - 1
            if last_fitting >= first_after:
                stop = cuts[last_fitting]
            elif first_after < len(cuts):
                stop = cuts[first_after]
        bounds.append((start, stop))
        start = stop
    return bounds


def stream_video(net: Callable[[Tensor], Tensor], source: FrameSource, *, scale: int, window_size: Sequence[int],
                 num_frame_testing: int = 0, num_frame_overlapping: int = 2, size_patch_testing: int = 0,
                 overlap_size: int = 20, in_chans: int | None = None, vfi: bool = False, clip_frames: int = 0,
                 pad_seq: bool = False, flip_seq: bool = False, center_frame_only: bool = False,
                 device: torch.device | None = None, autocast_dtype: torch.dtype | None = None, start: int = 0,
                 stop: int | None = None, prefetch: int = 0) -> Iterator[Tensor]:
    """Restore a video read frame by frame; yield each output frame as soon as it is final.

    The arguments mean what they mean for :func:`models.video_inference.infer_video` (same defaults), and the
    frames yielded equal ``infer_video(net, whole_video[None], ...)[0, start:stop]`` bit for bit.

    Args:
        net: the network, in eval mode and on ``device``.
        source: the input video, ``len(source)`` frames of ``(C, h, w)`` (C = ``in_chans``).
        start, stop: the output frames to restore, ``[start, stop)`` (default: all of them; see
            :func:`num_outputs`). Only the clips that overlap them run and only the input frames they need are read.
        prefetch: read up to this many input frames ahead in a background thread (0: read when needed).
        device: where the network runs (default: the CPU).

    Yields:
        ``(3, h*scale, w*scale)`` float32 CPU tensors, output frames ``start .. stop - 1`` in order.

    Raises:
        ValueError: bad settings (see ``infer_video``), a bad range, or a source whose frames do not match its
            length or each other's shape (naming the source).
    """
    n = len(source)
    if n < 1:
        raise ValueError(f"{source.name}: no frame to restore")
    n_out = num_outputs(n, vfi=vfi, center_frame_only=center_frame_only)
    stop = n_out if stop is None else int(stop)
    if not 0 <= start < stop <= n_out:
        raise ValueError(f"{source.name}: output frames [{start}, {stop}) are not within [0, {n_out})")
    settings = {"scale": scale, "window_size": window_size, "num_frame_testing": num_frame_testing,
                "num_frame_overlapping": num_frame_overlapping, "size_patch_testing": size_patch_testing,
                "overlap_size": overlap_size, "in_chans": in_chans, "vfi": vfi, "clip_frames": clip_frames,
                "pad_seq": pad_seq, "flip_seq": flip_seq, "center_frame_only": center_frame_only,
                "device": device or torch.device("cpu"), "autocast_dtype": autocast_dtype}
    if not streams(num_frame_testing, vfi=vfi, flip_seq=flip_seq):
        return _whole(net, source, n, start, stop, settings, prefetch)
    return _clips(net, source, n, start, stop, settings, prefetch)


@torch.no_grad()
def _whole(net: Callable[[Tensor], Tensor], source: FrameSource, n: int, start: int, stop: int,
           settings: dict, prefetch: int) -> Iterator[Tensor]:
    """The settings that need every frame at once: read them all, then :func:`infer_video`."""
    window = _Window(source, n, 0, prefetch)
    try:
        frames = [window.get(i) for i in range(n)]
        window.check_exhausted()
    finally:
        window.close()
    lq = torch.stack(frames)[None]
    del frames
    out = infer_video(net, lq, **settings)
    del lq
    for index in range(start, stop):
        yield out[0, index]


@torch.no_grad()
def _clips(net: Callable[[Tensor], Tensor], source: FrameSource, n: int, start: int, stop: int, settings: dict,
           prefetch: int) -> Iterator[Tensor]:
    """Clip by clip: sum each clip's output into the frames it covers, emit frames no later clip covers."""
    device = settings["device"]
    run = _Runner(net, device, settings["autocast_dtype"], settings["window_size"], keep_on_device=True)
    nft, nfo = int(settings["num_frame_testing"]), int(settings["num_frame_overlapping"])
    length = n + int(settings["pad_seq"])  # the padded sequence: frame n repeats frame n - 1
    if settings["center_frame_only"]:
        lo, hi = n // 2, n // 2 + 1
    else:
        lo, hi = start, stop
    clip = min(nft, length)
    starts = [s for s in tile_starts(length, nft, nfo) if s < hi and s + clip > lo]
    window = _Window(source, n, min(starts[0], n - 1), prefetch)
    sums: dict[int, Tensor] = {}
    counts: dict[int, int] = {}
    pending: _Finished | None = None
    lag = _pipelined(device)
    try:
        for k, s in enumerate(starts):
            lq = window.clip([min(i, n - 1) for i in range(s, s + clip)], device)
            if k == 0:
                check_tiling_args(lq.shape, window_size=settings["window_size"],
                                  size_patch_testing=settings["size_patch_testing"],
                                  in_chans=settings["in_chans"], vfi=False, pad_seq=settings["pad_seq"])
            out = _infer_clip(run, lq, settings["scale"], int(settings["size_patch_testing"]),
                              int(settings["overlap_size"]))
            del lq
            for i in range(clip):
                if lo <= s + i < hi:
                    if s + i in sums:
                        sums[s + i].add_(out[:, i])
                        counts[s + i] += 1
                    else:  # infer_video sums into zeros: 0.0 + x, which turns -0.0 into 0.0 as x + 0.0 does
                        sums[s + i] = out[:, i] + 0.0
                        counts[s + i] = 1
            del out
            following = starts[k + 1] if k + 1 < len(starts) else hi
            window.release_before(min(following, n - 1))
            done = sorted(i for i in sums if i < following)
            finished = _Finished([sums.pop(i) for i in done], [float(counts.pop(i)) for i in done],
                                 device) if done else None
            if pending is not None:
                yield from pending.frames()
                pending = None
            if finished is not None and lag:
                pending = finished
            elif finished is not None:
                yield from finished.frames()
        if pending is not None:
            yield from pending.frames()
        if hi == n and not settings["center_frame_only"]:
            window.check_exhausted()
    finally:
        window.close()


def _pipelined(device: torch.device) -> bool:
    """Hand out a clip's finished frames only once the next clip is queued (the device computes meanwhile)."""
    return device.type == "cuda"


class _Finished:
    """Frames whose sums are complete: divided by their counts on the device, then on CUDA copied back at once into
    pinned memory (without waiting; :meth:`frames` waits for the copy)."""

    def __init__(self, sums: list[Tensor], counts: list[float], device: torch.device) -> None:
        # a device tensor of counts: a CUDA division by a CPU scalar multiplies by the reciprocal (not bit-exact)
        divisor = _to_device(torch.tensor(counts, dtype=torch.float32).view(-1, 1, 1, 1, 1), device)
        self.event = None
        if device.type == "cuda":
            self.frames_ = torch.empty((len(sums), *sums[0].shape), dtype=sums[0].dtype, pin_memory=True)
            for i, frame in enumerate(sums):
                self.frames_[i].copy_(frame.div_(divisor[i]), non_blocking=True)
            self.event = torch.cuda.Event()
            self.event.record()
        else:
            self.frames_ = [frame.div_(divisor[i]) for i, frame in enumerate(sums)]

    def frames(self) -> Iterator[Tensor]:
        """The frames ``(3, H, W)`` on the CPU, in order."""
        if self.event is not None:
            self.event.synchronize()
        for frame in self.frames_:
            yield frame[0]


def _to_device(x: Tensor, device: torch.device) -> Tensor:
    """``x`` on ``device`` without waiting: through pinned memory for CUDA (the caching host allocator keeps the
    pinned block until the copy is done), unchanged on the CPU."""
    if device.type != "cuda":
        return x.to(device)
    return x.pin_memory().to(device, non_blocking=True)


class _Window:
    """The input frames a clip may still need, read in order from ``source`` (from frame ``first``)."""

    def __init__(self, source: FrameSource, length: int, first: int, prefetch: int) -> None:
        self.source = source
        self.length = length
        self.next = first
        self.frames: dict[int, Tensor] = {}
        self.shape: tuple[int, ...] | None = None
        iterator = source.frames(first)
        self.iterator: Iterator[Tensor] = Prefetch(iterator, prefetch) if prefetch > 0 else iterator

    def get(self, index: int) -> Tensor:
        while self.next <= index:
            frame = next(self.iterator, None)
            if frame is None:
                raise ValueError(f"{self.source.name}: the frames end at frame {self.next}, but the source "
                                 f"states {self.length}")
            if self.shape is None:
                self.shape = tuple(frame.shape)
            elif tuple(frame.shape) != self.shape:
                raise ValueError(f"{self.source.name}: frame {self.next} is {tuple(frame.shape)} but the frames "
                                 f"before it are {self.shape}")
            self.frames[self.next] = frame
            self.next += 1
        return self.frames[index]

    def clip(self, indices: list[int], device: torch.device) -> Tensor:
        """``(1, len(indices), C, h, w)`` on ``device``: stacked in pinned memory and copied once for CUDA."""
        frames = [self.get(i) for i in indices]
        if device.type != "cuda":
            return torch.stack(frames)[None].to(device)
        host = torch.empty((len(frames), *frames[0].shape), dtype=frames[0].dtype, pin_memory=True)
        torch.stack(frames, out=host)
        return host[None].to(device, non_blocking=True)

    def release_before(self, index: int) -> None:
        for i in [i for i in self.frames if i < index]:
            del self.frames[i]

    def check_exhausted(self) -> None:
        if self.next == self.length and next(self.iterator, None) is not None:
            raise ValueError(f"{self.source.name}: more frames than the {self.length} the source states")

    def close(self) -> None:
        self.frames.clear()
        close = getattr(self.iterator, "close", None)
        if close is not None:
            close()


class Prefetch:
    """An iterator run in a background thread, at most ``depth`` items ahead (file reading and decoding release
    the GIL, so they overlap the consumer's work). An exception of the iterator is raised by :meth:`__next__`;
    :meth:`close` stops the thread and closes the iterator."""

    _END = object()

    def __init__(self, iterator: Iterator[Tensor], depth: int) -> None:
        self._queue: queue.Queue = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._done = False
        self._thread = threading.Thread(target=self._fill, args=(iterator,), name="frame-prefetch", daemon=True)
        self._thread.start()

    def _put(self, item: object) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _fill(self, iterator: Iterator[Tensor]) -> None:
        try:
            for item in iterator:
                if not self._put(item):
                    return
            self._put(self._END)
        except BaseException as exc:  # handed to the consumer, raised there
            self._put(exc)
        finally:
            close = getattr(iterator, "close", None)
            if close is not None:
                close()

    def __iter__(self) -> Iterator[Tensor]:
        return self

    def __next__(self) -> Tensor:
        if self._done:
            raise StopIteration
        item = self._queue.get()
        if item is self._END:
            self._done = True
            raise StopIteration
        if isinstance(item, BaseException):
            self._done = True
            raise item
        return item  # type: ignore[return-value]

    def close(self) -> None:
        """Stop reading ahead and close the iterator (idempotent)."""
        self._stop.set()
        while self._thread.is_alive():
            try:
                self._queue.get(timeout=0.1)
            except queue.Empty:
                pass
        self._done = True
