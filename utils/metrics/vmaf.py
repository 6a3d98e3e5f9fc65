"""VMAF through FFmpeg's libvmaf (model ``vmaf_v0.6.1``, built into libvmaf), from the ffmpeg binary that the
``imageio-ffmpeg`` wheel carries (the ``vmaf`` extra: ``pip install ".[vmaf]"``; its static build, FFmpeg 9 for
x86-64 Linux in imageio-ffmpeg 0.8.1, is configured with ``--enable-libvmaf``). PyAV's bundled FFmpeg has no libvmaf.

Frames are streamed to one ffmpeg process per clip through two pipes (no spool on disk): the distorted (our output)
on stdin, the reference (ground truth) on a second pipe, as raw 8-bit YUV whose luma is BT.601 limited-range Y of
the uint8-rounded RGB frames (the Y of PSNR_Y / NIQE, rounded; VMAF reads luma only, chroma is left at 128).
libvmaf writes per-frame scores and their pooled (arithmetic) mean to a JSON log, which :meth:`VmafStream.finish`
reads. VMAF's motion feature compares each reference frame with its neighbours (t-1 and t+1), so per-frame values of
a clip exist only once the whole clip has been seen: VMAF is a per-clip metric with per-frame values on the side.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import tempfile
from collections.abc import Iterable

import numpy as np

from utils.metrics.registry import MetricError

MODEL = "version=vmaf_v0.6.1"
EXTRA = 'pip install imageio-ffmpeg (the vmaf extra: pip install ".[vmaf]")'


@functools.lru_cache(maxsize=1)
def ffmpeg_with_libvmaf() -> str:
    """The path of an ffmpeg binary with libvmaf (imageio-ffmpeg's, or ``IMAGEIO_FFMPEG_EXE``).

    Raises:
        MetricError: imageio-ffmpeg is not installed, or its ffmpeg lacks libvmaf.
    """
    try:
        import imageio_ffmpeg
    except ImportError as err:
        raise MetricError(f"vmaf needs FFmpeg with libvmaf, which imageio-ffmpeg carries: {EXTRA}") from err
    exe = imageio_ffmpeg.get_ffmpeg_exe()
    try:
        filters = subprocess.run([exe, "-hide_banner", "-filters"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError) as err:
        raise MetricError(f"vmaf: cannot run {exe} ({err}); {EXTRA}") from err
    if not any(line.split()[1:2] == ["libvmaf"] for line in filters.splitlines()):
        raise MetricError(f"vmaf: the ffmpeg at {exe} was built without libvmaf; {EXTRA} (a build with libvmaf), "
                          f"or set IMAGEIO_FFMPEG_EXE to one")
    return exe


def _planes(y: np.ndarray) -> bytes:
    """One raw frame: luma ``y`` (H, W) uint8 and neutral chroma (4:2:0 for even sizes, else 4:4:4)."""
    h, w = y.shape
    c = (h // 2) * (w // 2) if h % 2 == 0 and w % 2 == 0 else h * w
    return y.tobytes() + bytes([128]) * (2 * c)


class VmafStream:
    """One clip's VMAF: :meth:`add` frames in order, then :meth:`finish`.

    Args:
        height, width: the frame size.
        threads: libvmaf's worker threads (0: its default).
    """

    def __init__(self, height: int, width: int, threads: int = 0) -> None:
        exe = ffmpeg_with_libvmaf()
        self.size = (height, width)
        self.frames = 0
        self._dir = tempfile.TemporaryDirectory(prefix="vmaf_")
        self._log = os.path.join(self._dir.name, "vmaf.json")
        fmt = "yuv420p" if height % 2 == 0 and width % 2 == 0 else "yuv444p"
        raw = ["-f", "rawvideo", "-pix_fmt", fmt, "-s", f"{width}x{height}", "-r", "25"]
        read_ref, self._ref = os.pipe()
        cmd = [exe, "-hide_banner", "-loglevel", "error", *raw, "-i", "pipe:0", *raw, "-i", f"pipe:{read_ref}",
               "-lavfi", f"[0:v][1:v]libvmaf=model={MODEL}:log_fmt=json:log_path={self._log}:n_threads={threads}",
               "-f", "null", "-"]
        try:
            self._proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stderr=subprocess.PIPE, pass_fds=(read_ref,))
        finally:
            os.close(read_ref)

    def add(self, out_y: np.ndarray, gt_y: np.ndarray) -> None:
        """Add one frame pair: (H, W) uint8 luma of the output and of the ground truth."""
        if out_y.shape != self.size or gt_y.shape != self.size:
            raise ValueError(f"vmaf: frames of {out_y.shape} / {gt_y.shape}, the clip's are {self.size}")
        try:
            self._proc.stdin.write(_planes(out_y))
            _write_all(self._ref, _planes(gt_y))
        except BrokenPipeError as err:
            raise RuntimeError(f"vmaf: ffmpeg stopped: {self._stderr()}") from err
        self.frames += 1

    def _stderr(self) -> str:
        lines = self._proc.stderr.read().decode(errors="replace").strip().splitlines()
        return lines[-1] if lines else f"exit code {self._proc.wait()}"

    def finish(self) -> tuple[list[float], float]:
        """Close the streams and return ``(per-frame scores, pooled mean)``."""
        self._proc.stdin.close()
        os.close(self._ref)
        err = self._stderr()
        if self._proc.wait() != 0 or not os.path.isfile(self._log):
            raise RuntimeError(f"vmaf: ffmpeg failed: {err}")
        with open(self._log) as fh:
            log = json.load(fh)
        self._dir.cleanup()
        frames = [float(f["metrics"]["vmaf"]) for f in sorted(log["frames"], key=lambda f: f["frameNum"])]
        return frames, float(log["pooled_metrics"]["vmaf"]["mean"])


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def vmaf_clip(out_y: Iterable[np.ndarray], gt_y: Iterable[np.ndarray], threads: int = 0) -> tuple[list[float], float]:
    """VMAF of a whole clip from its (H, W) uint8 luma frames (output, ground truth), e.g. read back from the saved
    frames of a clip that was restored in segments on several processes.

    Returns:
        ``(per-frame scores, pooled mean)``.
    """
    stream = None
    for o, g in zip(out_y, gt_y):
        stream = stream or VmafStream(*o.shape, threads=threads)
        stream.add(o, g)
    if stream is None:
        raise MetricError("vmaf: the clip has no frames")
    return stream.finish()
