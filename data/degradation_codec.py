"""Video-codec compression of a whole clip in memory (PyAV): the clip is encoded into a Matroska file held in an
``io.BytesIO`` and decoded back, so the LQ clip carries real inter-frame artefacts (motion-compensated prediction
drift, B-frame flicker, blocking that moves with the content), not per-frame JPEG look-alikes.

Encoders (:data:`ENCODERS`; those the installed ``av`` wheel lacks are refused by :func:`check_codec`):

- ``libx264`` (H.264) and ``libx265`` (H.265/HEVC): ``crf`` 0..51 (higher: worse) or a ``bitrate``; ``preset``
  sets the speed (x264/x265 presets ``ultrafast`` .. ``veryslow``);
- ``mpeg4`` (MPEG-4 part 2): a fixed quantiser ``qscale`` 2..31 (higher: worse) or a ``bitrate``;
- ``libvpx-vp9`` (VP9): ``crf`` 0..63 in constant-quality mode, or a ``bitrate``; ``deadline=good``, ``cpu-used=5``.

Every encoder runs single-threaded (x264 ``threads=1``; x265 ``pools=none:frame-threads=1``; VP9 ``threads=1``,
``row-mt=0``), so the bytes depend only on the clip and the settings, not on the machine's load or thread counts.
RGB <-> YUV 4:2:0 (BT.709, limited range; chroma the mean of each 2x2 block, upsampled bilinearly) is done here
in NumPy rather than by swscale, whose fast path is biased by about one level. Odd frame sizes are padded to even
by repeating the edge (``libx265`` pads to at least 128 x 128: the x265 of the PyAV wheel corrupts its heap on
some frames under 64 px and is not repeatable under 128 px) and the padding is cropped after decoding. On CPUs
with AVX-512, x264 is capped at AVX2 (its AVX-512 code is not repeatable on some clips).
"""

from __future__ import annotations

import functools
import io
from fractions import Fraction

import av
import cv2
import numpy as np

from data.degradations import to_float32

__all__ = ["CODEC_ALIASES", "ENCODERS", "available_encoders", "check_codec", "compress_clip", "encoder_name"]

ENCODERS = ("libx264", "libx265", "mpeg4", "libvpx-vp9")
CODEC_ALIASES = {"h264": "libx264", "h265": "libx265", "hevc": "libx265", "vp9": "libvpx-vp9"}
CRF_RANGE = {"libx264": (0, 51), "libx265": (0, 51), "libvpx-vp9": (0, 63)}
QSCALE_RANGE = (2, 31)
X26X_PRESETS = ("ultrafast", "superfast", "veryfast", "faster", "fast", "medium", "slow", "slower", "veryslow")
# x265 of the PyAV wheel corrupts its heap on some frames under 64 px and gives run-to-run different bytes on
# frames under 128 px (seen on 40x40 padded to 64x64 and, rarely, 64x64); at 128 px and more it is repeatable
_MIN_SIZE = {"libx265": 128}
_KR, _KB = 0.2126, 0.0722  # BT.709 luma weights of R and B


@functools.lru_cache(maxsize=1)
def available_encoders() -> tuple[str, ...]:
    """The :data:`ENCODERS` the installed PyAV/FFmpeg can encode with."""
    found = []
    for name in ENCODERS:
        try:
            av.codec.Codec(name, "w")
        except ValueError:  # av.codec.codec.UnknownCodecError: not built into this wheel
            continue
        found.append(name)
    return tuple(found)


def encoder_name(codec: str) -> str:
    """The encoder a codec name means (``h264`` -> ``libx264``; an encoder name is returned as it is)."""
    return CODEC_ALIASES.get(codec, codec)


def check_codec(codec: str) -> str | None:
    """Why ``codec`` cannot be used here (unknown, or missing from this ``av`` wheel), or ``None``."""
    name = encoder_name(codec)
    if name not in ENCODERS:
        return f"unknown codec {codec!r}; known: {', '.join(ENCODERS)} (aliases {', '.join(CODEC_ALIASES)})"
    if name not in available_encoders():
        return f"codec {codec!r} is not in this PyAV build; available: {', '.join(available_encoders()) or 'none'}"
    return None


def _rgb_to_yuv420(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """float ``(T, H, W, 3)`` (H, W even) -> uint8 planes Y ``(T, H, W)``, Cb and Cr ``(T, H/2, W/2)``."""
    x = np.clip(x, 0, 1)
    y = _KR * x[..., 0] + (1 - _KR - _KB) * x[..., 1] + _KB * x[..., 2]
    cb = (x[..., 2] - y) / (2 - 2 * _KB)
    cr = (x[..., 0] - y) / (2 - 2 * _KR)

    def half(c: np.ndarray) -> np.ndarray:
        return 0.25 * (c[:, 0::2, 0::2] + c[:, 1::2, 0::2] + c[:, 0::2, 1::2] + c[:, 1::2, 1::2])

    def level(v: np.ndarray, gain: float, offset: float) -> np.ndarray:
        return np.clip(np.rint(v * gain + offset), 0, 255).astype(np.uint8)

    return level(y, 219, 16), level(half(cb), 224, 128), level(half(cr), 224, 128)


def _yuv420_to_rgb(planes: np.ndarray, h: int, w: int) -> np.ndarray:
    """One decoded ``(H * 3 / 2, W)`` yuv420p array -> float32 RGB ``(H, W, 3)`` in [0, 1]."""
    y = (planes[:h].astype(np.float32) - 16) / 219
    chroma = planes[h:].reshape(2, h // 2, w // 2).astype(np.float32)
    cb, cr = ((cv2.resize(c, (w, h), interpolation=cv2.INTER_LINEAR) - 128) / 224 for c in chroma)
    r = y + (2 - 2 * _KR) * cr
    b = y + (2 - 2 * _KB) * cb
    g = (y - _KR * r - _KB * b) / (1 - _KR - _KB)
    return np.clip(np.stack([r, g, b], axis=-1), 0, 1)


@functools.lru_cache(maxsize=1)
def _x264_params() -> str:
    """x264's AVX-512 code gives run-to-run different bytes on some clips (a 64x64 clip: 2 outputs in 150 runs on a
    Xeon with AVX-512, whatever the threads); with its instruction sets capped at AVX2 (which every AVX-512 CPU
    has) the output repeats. Other CPUs keep x264's own choice."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            flags = f.read()
    except OSError:
        return ""
    return "asm=AVX2" if "avx512" in flags else ""


def _options(name: str, crf: int | None, qscale: int | None, preset: str) -> dict[str, str]:
    if name == "libx264":
        opts = {"preset": preset, "threads": "1"}
        if _x264_params():
            opts["x264-params"] = _x264_params()
    elif name == "libx265":
        opts = {"preset": preset, "x265-params": "pools=none:frame-threads=1:log-level=error"}
    elif name == "libvpx-vp9":
        opts = {"deadline": "good", "cpu-used": "5", "row-mt": "0", "threads": "1"}
    else:
        opts = {}
    if crf is not None:
        opts["crf"] = str(int(crf))
        if name == "libvpx-vp9":
            opts["b"] = "0"  # constant quality
    if qscale is not None:
        opts["qmin"] = opts["qmax"] = str(int(qscale))
    return opts


def compress_clip(clip: np.ndarray, codec: str, *, crf: int | None = None, qscale: int | None = None,
                  bitrate: float | None = None, fps: int = 25, preset: str = "medium") -> np.ndarray:
    """Encode a clip as one video stream and decode it back.

    Args:
        clip: ``(T, H, W, 3)`` RGB, uint8 or float in [0, 1].
        codec: an encoder of :data:`ENCODERS` (or an alias of :data:`CODEC_ALIASES`).
        crf: constant rate factor (libx264, libx265: 0..51; libvpx-vp9: 0..63); higher is worse.
        qscale: fixed quantiser of ``mpeg4`` (2..31); higher is worse.
        bitrate: target bits per second at ``fps`` (instead of ``crf`` / ``qscale``).
        fps: the frame rate the stream is tagged with (what a ``bitrate`` is spread over).
        preset: x264 / x265 speed preset.

    Returns:
        float32 ``(T, H, W, 3)`` in [0, 1].

    Raises:
        ValueError: an unavailable codec, or no (or more than one) rate setting for it.
    """
    name = encoder_name(codec)
    why = check_codec(codec)
    if why:
        raise ValueError(why)
    if sum(v is not None for v in (crf, qscale, bitrate)) != 1:
        raise ValueError(f"{name}: give exactly one of crf, qscale, bitrate")
    if (crf is not None and name not in CRF_RANGE) or (qscale is not None and name != "mpeg4"):
        raise ValueError(f"{name}: crf applies to {', '.join(CRF_RANGE)}; qscale to mpeg4")
    x = to_float32(clip)
    t, h, w, _ = x.shape
    least = _MIN_SIZE.get(name, 2)
    ph, pw = max(h + h % 2, least), max(w + w % 2, least)
    if (ph, pw) != (h, w):
        x = np.pad(x, ((0, 0), (0, ph - h), (0, pw - w), (0, 0)), mode="edge")
    luma, cb, cr = _rgb_to_yuv420(x)
    buf = io.BytesIO()
    with av.open(buf, "w", format="matroska") as container:
        stream = container.add_stream(name, rate=fps, options=_options(name, crf, qscale, preset))
        stream.width, stream.height, stream.pix_fmt = pw, ph, "yuv420p"
        stream.codec_context.thread_count = 1
        stream.codec_context.time_base = Fraction(1, fps)
        if bitrate is not None:
            stream.bit_rate = int(bitrate)
        for i in range(t):
            data = np.concatenate([luma[i].ravel(), cb[i].ravel(), cr[i].ravel()]).reshape(ph * 3 // 2, pw)
            frame = av.VideoFrame.from_ndarray(data, format="yuv420p")
            frame.pts = i
            container.mux(stream.encode(frame))
        container.mux(stream.encode(None))
    buf.seek(0)
    out = np.empty((t, ph, pw, 3), np.float32)
    count = 0
    with av.open(buf, "r") as container:
        for frame in container.decode(video=0):
            if count == t:
                raise RuntimeError(f"{name}: decoding gave more than the {t} frames encoded")
            if frame.format.name != "yuv420p":
                frame = frame.reformat(format="yuv420p")
            out[count] = _yuv420_to_rgb(frame.to_ndarray(), ph, pw)
            count += 1
    if count != t:
        raise RuntimeError(f"{name}: {t} frames were encoded but {count} decoded")
    return np.ascontiguousarray(out[:, :h, :w]) if (ph, pw) != (h, w) else out
