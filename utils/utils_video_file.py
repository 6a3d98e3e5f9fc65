"""Video files through PyAV (FFmpeg): lazy frame-by-frame reading and atomic writing with the audio carried over.

:class:`VideoReader` decodes one frame at a time, in order, as RGB ``(H, W, 3)`` uint8 arrays, and reports the
exact frame rate (a :class:`~fractions.Fraction`, e.g. ``24000/1001``), the frame size, the number of frames and
whether the file has an audio track.

:class:`VideoWriter` encodes frames one at a time with one of :data:`CODECS`:

- ``ffv1`` (``.mkv``, ``.avi``): lossless 8-bit RGB (``bgr0``); frames read back bit-exact.
- ``png`` (``.mov``): lossless RGB, one PNG per frame. PyAV refuses PNG in Matroska (no official codec id).
- ``h264`` (``.mp4``, ``.mkv``, ``.mov``): lossy, quality ``crf`` (default 18), plays everywhere.
- ``h265`` (the same): lossy, ``crf`` default 20, about half the size of H.264 at the same quality.

Both lossy codecs store YUV 4:2:0 (BT.709, limited range, left-sited chroma, tagged as such), so they need an
even frame size.
The codec defaults to the container's usual one (``.mkv``/``.avi`` -> ffv1, ``.mp4``/``.mov`` -> h264). The
writer writes to a hidden temporary file in the destination folder and ``os.replace``s it onto the output's
name only when it closes successfully: on any error the temporary is removed and nothing appears under the
output's name (an existing file there is left untouched).

``audio_from`` copies the first audio track of another file (normally the input video): its packets are
remuxed as they are (no re-encoding) when the container can store that codec (Matroska stores any). When it
cannot (e.g. Opus or FLAC in ``.mov``), the track is re-encoded to AAC and a warning says so.
Audio is shifted by the source video's start time, so it stays in sync with frame 0.

Every problem with a file is one :class:`VideoFileError` (a ``ValueError``) whose message names the file.
"""

from __future__ import annotations

import io
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass
from fractions import Fraction
from types import TracebackType
from typing import Any

import av
import numpy as np
import torch
from av.video.reformatter import ColorPrimaries, ColorRange, Colorspace, ColorTrc, Interpolation

from utils import utils_fs

logger = logging.getLogger(__name__)

__all__ = ["CODECS", "VideoFileError", "VideoReader", "VideoWriter"]


class VideoFileError(ValueError):
    """A video file cannot be read or written as asked; the message names the file and says what would work."""


@dataclass(frozen=True)
class _Codec:
    encoder: str
    pix_fmt: str
    extensions: tuple[str, ...]
    default_crf: int | None = None  # None: lossless, no quality setting


CODECS: dict[str, _Codec] = {
    "ffv1": _Codec("ffv1", "bgr0", (".mkv", ".avi")),
    "png": _Codec("png", "rgb24", (".mov",)),
    "h264": _Codec("libx264", "yuv420p", (".mp4", ".mkv", ".mov"), default_crf=18),
    "h265": _Codec("libx265", "yuv420p", (".mp4", ".mkv", ".mov"), default_crf=20),
}
_FORMATS = {".mkv": "matroska", ".avi": "avi", ".mp4": "mp4", ".mov": "mov"}
_DEFAULT_CODECS = {".mkv": "ffv1", ".avi": "ffv1", ".mp4": "h264", ".mov": "h264"}
# swscale's fast default (what OpenCV and PyAV use) point-samples chroma and truncates: it biases RGB by about -1
# level and loses 2-14 dB PSNR on colourful detail; these flags are bias-free (about 18 ms instead of 0.5 ms per
# 720p frame, small next to restoring it).
_TO_RGB_FLAGS = Interpolation.BICUBIC | Interpolation.ACCURATE_RND | Interpolation.FULL_CHR_H_INT
_KR, _KB = 0.2126, 0.0722  # BT.709 luma weights of R and B


def frame_to_rgb(frame: av.VideoFrame) -> np.ndarray:
    """A decoded frame as ``(H, W, 3)`` uint8 RGB, with the bias-free conversion (every reader uses this one)."""
    return frame.to_ndarray(format="rgb24", src_color_range=frame.color_range, interpolation=_TO_RGB_FLAGS)


def _exact_rate(rate: Fraction) -> Fraction:
    """Undo Matroska's rounding: it stores the frame duration in whole nanoseconds and FFmpeg reduces the rate to
    terms under 30000, so 60000/1001 reads back as 19001/317. An integer or NTSC (n * 1000/1001) rate whose frame
    duration is within 10 ns is taken instead (29.97 = 2997/100 and 30000/1001 are 33 ns apart)."""
    for candidate in (Fraction(round(rate)), Fraction(round(rate * Fraction(1001, 1000)) * 1000, 1001)):
        if candidate and abs(1 / candidate - 1 / rate) <= Fraction(10, 10**9):
            return candidate
    return rate


def _open_input(path: str) -> av.container.InputContainer:
    try:
        return av.open(path)
    except (av.FFmpegError, OSError) as e:
        raise VideoFileError(f"{path}: cannot open as a video ({getattr(e, 'strerror', None) or e})") from e


class VideoReader:
    """Lazy reader of the first video stream of a file.

    Iterating yields the frames in order as RGB ``(H, W, 3)`` uint8 numpy arrays, decoding one frame per step:
    no more than one decoded frame is held by the reader at a time. YUV frames are converted with the colour
    matrix and range the stream is tagged with (BT.601 limited range when untagged, FFmpeg's default), with
    bicubic chroma upsampling and exact rounding.

    Attributes:
        path: the file.
        fps: the average frame rate, exact (``Fraction(24000, 1001)``, also from Matroska, which stores rounded
            frame durations); 25 when the file does not say.
        width, height: the frame size of the stream.
        has_audio: whether the file holds an audio track.
        decoded_frames: how many frames the decoder has produced so far (all iterations together).

    Raises:
        VideoFileError: unreadable file or no video stream (on construction); zero frames, a frame size that
            changes mid-stream or a decoding failure (while iterating).
    """

    def __init__(self, path: str) -> None:
        self.path = str(path)
        self._container = _open_input(self.path)
        self._iterations = 0
        try:
            if not self._container.streams.video:
                raise VideoFileError(f"{self.path}: no video stream with frames (audio-only, an empty video track, "
                                     f"or not a video file)")
            stream = self._container.streams.video[0]
            rate = stream.average_rate or stream.guessed_rate or stream.base_rate
            if not rate:
                logger.warning("%s: the file gives no frame rate; assuming 25 fps", self.path)
            self.fps = Fraction(rate) if rate else Fraction(25)
            if "matroska" in self._container.format.name:
                self.fps = _exact_rate(self.fps)
            self.width = int(stream.codec_context.width)
            self.height = int(stream.codec_context.height)
            self.has_audio = bool(self._container.streams.audio)
            self._stream_frames = int(stream.frames or 0)
        except BaseException:
            self._container.close()
            raise
        self._num_frames: int | None = None
        self.decoded_frames = 0

    @property
    def num_frames(self) -> int:
        """The number of frames: from the container when it records it (mp4, mov), else counted once by
        demuxing the packets (no decoding)."""
        if self._num_frames is None:
            count = self._stream_frames
            if count <= 0:
                with _open_input(self.path) as container:
                    count = sum(1 for p in container.demux(container.streams.video[0]) if p.size)
            if count == 0:
                raise VideoFileError(f"{self.path}: the video stream has zero frames")
            self._num_frames = count
        return self._num_frames

    def __iter__(self) -> Iterator[np.ndarray]:
        return self.frames()

    def frames(self, start: int = 0) -> Iterator[np.ndarray]:
        """Frames ``start, start + 1, ...`` as RGB ``(H, W, 3)`` uint8 arrays.

        Frames before ``start`` are decoded (streams are not seekable to an exact frame in general) but not
        converted. Each call after the first re-opens the file and starts again from its beginning.
        """
        if start < 0:
            raise ValueError(f"start must be >= 0, got {start}")
        if self._container is None:
            raise VideoFileError(f"{self.path}: the reader is closed")
        if self._iterations:
            self._container.close()
            self._container = _open_input(self.path)
        self._iterations += 1
        return self._decode(self._container, start)

    def _decode(self, container: av.container.InputContainer, start: int) -> Iterator[np.ndarray]:
        index = -1
        frames = container.decode(container.streams.video[0])
        while True:
            try:
                frame = next(frames, None)
            except av.FFmpegError as e:
                raise VideoFileError(f"{self.path}: cannot decode frame {index + 1} ({e})") from e
            if frame is None:
                break
            index += 1
            self.decoded_frames += 1
            if index == 0 and not (self.width and self.height):  # size unknown from the header
                self.width, self.height = frame.width, frame.height
            if (frame.width, frame.height) != (self.width, self.height):
                raise VideoFileError(f"{self.path}: frame {index} is {frame.width}x{frame.height} but the video "
                                     f"is {self.width}x{self.height}; the frame size must not change mid-stream")
            if index >= start:
                yield frame_to_rgb(frame)
        if index < 0:
            raise VideoFileError(f"{self.path}: the video stream has zero decodable frames")
        if index < start:
            raise VideoFileError(f"{self.path}: start frame {start} is past the last frame ({index})")

    def close(self) -> None:
        """Close the file (idempotent)."""
        if self._container is not None:
            self._container.close()
            self._container = None

    def __enter__(self) -> VideoReader:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


def _as_fraction(path: str, fps: Fraction | int | float | str) -> Fraction:
    try:
        rate = Fraction(fps).limit_denominator(1001) if isinstance(fps, float) else Fraction(fps)
    except (TypeError, ValueError, ZeroDivisionError, OverflowError) as e:
        raise VideoFileError(f"{path}: fps must be a positive number or fraction, got {fps!r}") from e
    if rate <= 0:
        raise VideoFileError(f"{path}: fps must be positive, got {fps!r}")
    return rate


def _to_rgb24(frame: torch.Tensor | np.ndarray) -> np.ndarray:
    """``(3, H, W)`` float in [0, 1] (clamped, rounded) or ``(H, W, 3)`` uint8 -> ``(H, W, 3)`` uint8."""
    frame = torch.as_tensor(frame).detach()
    if frame.dtype != torch.uint8:
        if frame.ndim != 3 or frame.shape[0] != 3:
            raise ValueError(f"a float frame must be (3, H, W), got {tuple(frame.shape)}")
        frame = frame.float().clamp(0, 1).mul(255).round().to(torch.uint8).permute(1, 2, 0)
    if frame.ndim != 3 or frame.shape[2] != 3:
        raise ValueError(f"a uint8 frame must be (H, W, 3), got {tuple(frame.shape)}")
    return np.ascontiguousarray(frame.cpu().numpy())


def _rgb_to_yuv420(rgb: np.ndarray) -> av.VideoFrame:
    """``(H, W, 3)`` uint8 RGB (H, W even) -> a BT.709 limited-range yuv420p frame with left-sited chroma.

    Done here rather than by swscale, whose output chroma siting PyAV cannot set: decoders take H.264/HEVC chroma
    as left-sited (on the even columns, between two rows), and swscale's centred chroma read back that way
    costs about 3 dB.
    """
    x = rgb.astype(np.float32) / 255
    y = _KR * x[..., 0] + (1 - _KR - _KB) * x[..., 1] + _KB * x[..., 2]

    def subsample(c: np.ndarray) -> np.ndarray:
        c = 0.5 * (c[0::2] + c[1::2])
        c = np.pad(c, ((0, 0), (1, 1)), mode="edge")
        return 0.25 * c[:, 0:-2:2] + 0.5 * c[:, 1:-1:2] + 0.25 * c[:, 2::2]

    planes = [y * 219 + 16, subsample((x[..., 2] - y) / (2 - 2 * _KB)) * 224 + 128,
              subsample((x[..., 0] - y) / (2 - 2 * _KR)) * 224 + 128]
    data = np.concatenate([np.clip(np.rint(p), 0, 255).astype(np.uint8).ravel() for p in planes])
    frame = av.VideoFrame.from_ndarray(data.reshape(rgb.shape[0] * 3 // 2, rgb.shape[1]), format="yuv420p")
    frame.colorspace, frame.color_range = int(Colorspace.ITU709), int(ColorRange.MPEG)
    return frame


def _remuxable(format_name: str, template: av.audio.stream.AudioStream) -> bool:
    """Whether a ``format_name`` file can store ``template``'s packets as they are (tried on a header in memory:
    FFmpeg's codec query says yes to some pairs the muxer then rejects, such as FLAC or Opus in mov)."""
    try:
        with av.open(io.BytesIO(), "w", format=format_name) as probe:
            probe.add_stream_from_template(template)
            probe.start_encoding()
        return True
    except (av.FFmpegError, ValueError):
        return False


class _AudioCopy:
    """Streams the first audio track of ``source`` into an output container: remuxed, or re-encoded to AAC."""

    def __init__(self, source: str, container: av.container.InputContainer) -> None:
        self.source = source
        self.input = container
        src = self.input.streams.audio[0]
        video = self.input.streams.video[0] if self.input.streams.video else None
        start = video.start_time * video.time_base if video and video.start_time is not None else 0
        self.offset = round(start / src.time_base)  # source pts of the first video frame, in audio units
        self.time_base = src.time_base
        self.packets = self.input.demux(src)
        self.done = False
        self.remux = True
        self.stream: Any = None

    def add_stream(self, container: av.container.OutputContainer, format_name: str, out_path: str) -> None:
        """Add the output audio stream (after the video one, so that the video is stream 0)."""
        src = self.input.streams.audio[0]
        self.remux = _remuxable(format_name, src)
        if self.remux:
            self.stream = container.add_stream_from_template(src)
            return
        rates = av.codec.Codec("aac", "w").audio_rates or ()
        self.stream = container.add_stream("aac", rate=src.sample_rate if src.sample_rate in rates else 48000)
        self.stream.layout = src.layout
        logger.warning("%s: a %s file cannot hold %s audio as it is; the audio of %s is re-encoded to AAC "
                       "(write .mkv to keep it untouched)", out_path, format_name, src.codec_context.name, self.source)

    def pump(self, container: av.container.OutputContainer, until: float | None) -> None:
        """Mux the audio up to ``until`` seconds of output time (all of it for ``None``)."""
        while not self.done:
            packet = next(self.packets, None)
            if packet is None:
                self.done = True
                if not self.remux:  # drain the decoder, then the encoder
                    for frame in self.input.streams.audio[0].decode(None):
                        container.mux(self.stream.encode(frame))
                    container.mux(self.stream.encode(None))
                break
            if packet.dts is None:  # the demuxer's final flush packet
                continue
            if packet.pts is not None:
                packet.pts -= self.offset
            packet.dts -= self.offset
            if self.remux:
                packet.stream = self.stream
                container.mux(packet)
            else:
                for frame in packet.decode():
                    container.mux(self.stream.encode(frame))
            if until is not None and packet.dts * self.time_base >= until:
                break

    def close(self) -> None:
        self.input.close()


class VideoWriter:
    """Encode RGB frames one at a time into a video file, atomically.

    Args:
        path: the output file; its extension picks the container (``.mkv``, ``.mp4``, ``.mov``, ``.avi``).
        fps: the frame rate, kept exact (``Fraction(24000, 1001)``, ``"30000/1001"``, 25; a float is read as the
            nearest fraction with a denominator up to 1001, so 29.97 stays 2997/100).
        codec: ``'ffv1'``, ``'png'``, ``'h264'`` or ``'h265'`` (see the module docstring); default: the usual one of
            the container.
        crf: quality of h264/h265 (lower is better, 0 is lossless in YUV; default 18 / 20).
        preset: x264/x265 speed preset (``'medium'``; ``'slow'`` gives smaller files).
        audio_from: a file whose first audio track is copied into the output (no-op when it has none).

    Frames are ``(3, H, W)`` float tensors/arrays in [0, 1] (clamped and rounded) or ``(H, W, 3)`` uint8; all of
    one size. Use as a context manager, or call :meth:`close` (and :meth:`abort` on failure).

    Raises:
        VideoFileError: unknown codec or container, a codec the container cannot hold, an odd frame size for
            h264/h265, a frame size that changes, no frame written, an unreadable ``audio_from``, or an FFmpeg
            failure. The temporary file is removed first.
    """

    def __init__(self, path: str, fps: Fraction | int | float | str, codec: str | None = None,
                 crf: int | None = None, preset: str = "medium", audio_from: str | None = None) -> None:
        self.path = str(path)
        ext = os.path.splitext(self.path)[1].lower()
        if ext not in _FORMATS:
            raise VideoFileError(f"{self.path}: cannot write a {ext or 'extension-less'} video; use one of "
                                 f"{', '.join(_FORMATS)}")
        self.codec_name = codec or _DEFAULT_CODECS[ext]
        if self.codec_name not in CODECS:
            raise VideoFileError(f"{self.path}: unknown codec {codec!r}; use one of {', '.join(CODECS)}")
        self.codec = CODECS[self.codec_name]
        if ext not in self.codec.extensions:
            raise VideoFileError(f"{self.path}: {self.codec_name} cannot be written to a {ext} file; use "
                                 f"{' or '.join(self.codec.extensions)}")
        if crf is not None and self.codec.default_crf is None:
            raise VideoFileError(f"{self.path}: crf applies to h264/h265 only ({self.codec_name} is lossless)")
        self.fps = _as_fraction(self.path, fps)
        self.crf = self.codec.default_crf if crf is None else int(crf)
        self.preset = preset
        self.frames_written = 0
        self._format = _FORMATS[ext]
        self._stream: Any = None
        self._size: tuple[int, int] | None = None
        self._audio: _AudioCopy | None = None
        self._container: Any = None
        folder = os.path.dirname(os.path.abspath(self.path))
        os.makedirs(folder, exist_ok=True)
        # Not mkstemp: its 0600 mode would stay on the result. A hidden name, unique per process and writer.
        self._tmp = utils_fs.temporary_name(os.path.join(folder, os.path.basename(self.path)), suffix=ext)
        try:
            options = {"movflags": "+faststart"} if self._format in ("mp4", "mov") else {}
            self._container = av.open(self._tmp, "w", format=self._format, options=options)
            if audio_from is not None:
                source = _open_input(str(audio_from))
                if source.streams.audio:
                    self._audio = _AudioCopy(str(audio_from), source)
                else:
                    source.close()
                    logger.info("%s: %s has no audio track; writing video only", self.path, audio_from)
        except BaseException as e:
            self.abort()
            if isinstance(e, av.FFmpegError):
                raise VideoFileError(f"{self.path}: cannot write ({e})") from e
            raise

    def _open_stream(self, width: int, height: int) -> None:
        name = self.codec_name
        if self.codec.pix_fmt == "yuv420p" and (width % 2 or height % 2):
            even = f"{width - width % 2}x{height - height % 2}"
            raise VideoFileError(f"{self.path}: {name} ({self.codec.pix_fmt}) needs an even frame size but the "
                                 f"frames are {width}x{height}; crop to {even} or pad to "
                                 f"{width + width % 2}x{height + height % 2}, or write losslessly with "
                                 f"codec='ffv1' to a .mkv file")
        options = {}
        if self.crf is not None:
            options = {"crf": str(self.crf), "preset": self.preset}
            if name == "h265":
                options["x265-params"] = "log-level=error"
        stream = self._container.add_stream(self.codec.encoder, rate=self.fps, options=options)
        stream.width, stream.height, stream.pix_fmt = width, height, self.codec.pix_fmt
        stream.codec_context.time_base = 1 / self.fps
        if self.codec.pix_fmt == "yuv420p":  # tag what the RGB -> YUV conversion in write() does
            ctx = stream.codec_context
            ctx.colorspace, ctx.color_range = int(Colorspace.ITU709), int(ColorRange.MPEG)
            ctx.color_primaries, ctx.color_trc = int(ColorPrimaries.BT709), int(ColorTrc.BT709)
            if name == "h265" and self._format in ("mp4", "mov"):
                stream.codec_tag = "hvc1"  # what Apple players require for HEVC
        self._stream = stream
        self._size = (width, height)
        if self._audio is not None:
            self._audio.add_stream(self._container, self._format, self.path)

    def write(self, frame: torch.Tensor | np.ndarray) -> None:
        """Append one frame: ``(3, H, W)`` float in [0, 1] or ``(H, W, 3)`` uint8."""
        if self._container is None:
            raise VideoFileError(f"{self.path}: the writer is closed")
        try:
            rgb = _to_rgb24(frame)
            height, width = rgb.shape[:2]
            if self._stream is None:
                self._open_stream(width, height)
            elif (width, height) != self._size:
                raise VideoFileError(f"{self.path}: frame {self.frames_written} is {width}x{height} but the video "
                                     f"is {self._size[0]}x{self._size[1]}; all frames must have one size")
            if self.codec.pix_fmt == "yuv420p":
                vframe = _rgb_to_yuv420(rgb)
            else:
                vframe = av.VideoFrame.from_ndarray(rgb, format="rgb24")
            vframe.pts = self.frames_written
            self._container.mux(self._stream.encode(vframe))
            self.frames_written += 1
            if self._audio is not None:
                self._audio.pump(self._container, float(self.frames_written / self.fps))
        except BaseException as e:
            self.abort()
            if isinstance(e, (av.FFmpegError, ValueError)) and not isinstance(e, VideoFileError):
                raise VideoFileError(f"{self.path}: cannot write frame {self.frames_written} ({e})") from e
            raise

    def close(self) -> None:
        """Flush the encoder, finish the file and move it onto ``path``."""
        if self._container is None:
            return
        try:
            if self._stream is None:
                raise VideoFileError(f"{self.path}: no frame was written; a video needs at least one")
            self._container.mux(self._stream.encode(None))
            if self._audio is not None:
                self._audio.pump(self._container, None)
                self._audio.close()
                self._audio = None
            self._container.close()
            self._container = None
            os.replace(self._tmp, self.path)
        except BaseException as e:
            self.abort()
            if isinstance(e, (av.FFmpegError, OSError)):
                raise VideoFileError(f"{self.path}: cannot finish the file ({e})") from e
            raise

    def abort(self) -> None:
        """Discard the output: close everything and remove the temporary file (idempotent)."""
        for closer in (self._audio, self._container):
            if closer is not None:
                try:
                    closer.close()
                except Exception:  # already failing: the temporary is removed below all the same
                    logger.debug("closing %s while aborting failed", self.path, exc_info=True)
        self._audio = None
        self._container = None
        if os.path.exists(self._tmp):
            os.remove(self._tmp)

    def __enter__(self) -> VideoWriter:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()
