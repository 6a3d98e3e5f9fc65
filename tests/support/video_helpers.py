"""Small synthetic video and audio files for the video-file tests, made with PyAV."""

from __future__ import annotations

from fractions import Fraction

import av
import numpy as np

FPS = Fraction(24000, 1001)


def moving_frames(count: int = 8, height: int = 48, width: int = 64) -> list[np.ndarray]:
    """``count`` RGB ``(H, W, 3)`` uint8 frames: smooth colour gradients with a bright square moving across."""
    yy, xx = np.mgrid[0:height, 0:width].astype(np.float64)
    frames = []
    for t in range(count):
        r = 0.5 + 0.4 * np.sin((xx + 2 * t) / 9.0)
        g = 0.5 + 0.4 * np.cos((yy - t) / 11.0)
        b = 0.5 + 0.3 * np.sin((xx + yy + 3 * t) / 15.0)
        img = np.stack([r, g, b], axis=-1)
        x0, y0 = (3 * t) % (width - 12), (2 * t) % (height - 12)
        img[y0:y0 + 12, x0:x0 + 12] = (0.95, 0.9, 0.2)
        frames.append((img * 255).round().astype(np.uint8))
    return frames


def write_sine(path: str, seconds: float, codec: str = "pcm_s16le", rate: int = 44100,
               format_name: str | None = None) -> int:
    """A mono 440 Hz sine of ``seconds`` in ``path``; returns its number of samples."""
    samples = int(round(rate * seconds))
    wave = 0.3 * np.sin(2 * np.pi * 440 * np.arange(samples) / rate)
    with av.open(path, "w", format=format_name) as container:
        stream = container.add_stream(codec, rate=rate)
        stream.layout = "mono"
        fmt = stream.codec_context.format.name
        data = {"s16": (wave * 32767).astype(np.int16), "s32": (wave * 2**31).astype(np.int32)}.get(
            fmt, wave.astype(np.float32))
        frame = av.AudioFrame.from_ndarray(data[None], format=fmt, layout="mono")
        frame.sample_rate, frame.pts = rate, 0
        container.mux(stream.encode(frame))
        container.mux(stream.encode(None))
    return samples


def audio_packets(path: str) -> list[bytes]:
    """The payloads of the packets of the first audio stream."""
    with av.open(path) as container:
        return [bytes(p) for p in container.demux(container.streams.audio[0]) if p.size]


def audio_info(path: str) -> tuple[str, int]:
    """The codec name and the decoded number of samples of the first audio stream."""
    with av.open(path) as container:
        stream = container.streams.audio[0]
        return stream.codec_context.name, sum(f.samples for f in container.decode(stream))
