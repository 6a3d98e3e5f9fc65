"""Video files through PyAV: lossless and lossy round trips, exact frame rates, audio carried over, lazy reading,
one clear error per bad input with nothing left behind, and the video-file test dataset."""

from __future__ import annotations

import logging
import os
from fractions import Fraction

import av
import numpy as np
import pytest
import torch

from data.dataset_video_file import VideoFileTestDataset, read_video, write_video
from tests.support.video_helpers import FPS, audio_info, audio_packets, moving_frames, write_sine
from utils.utils_image import calculate_psnr
from utils.utils_video_clips import is_video_file, write_clip_video
from utils.utils_video_file import VideoFileError, VideoReader, VideoWriter


def _write(path, frames, fps=FPS, **kwargs) -> str:
    with VideoWriter(str(path), fps, **kwargs) as writer:
        for frame in frames:
            writer.write(frame)
    return str(path)


def _read(path) -> tuple[list[np.ndarray], VideoReader]:
    with VideoReader(str(path)) as reader:
        return list(reader), reader


def _one_line_naming(err: pytest.ExceptionInfo, path) -> str:
    message = str(err.value)
    assert str(path) in message and "\n" not in message, message
    return message


@pytest.mark.parametrize("codec,ext", [("ffv1", ".mkv"), ("ffv1", ".avi"), ("png", ".mov")])
def test_lossless_round_trip_is_bit_exact(tmp_path, codec, ext) -> None:
    frames = moving_frames()
    path = _write(tmp_path / f"clip{ext}", frames, codec=codec)
    decoded, reader = _read(path)
    assert len(decoded) == reader.num_frames == 8
    assert (reader.width, reader.height) == (64, 48) and reader.fps == FPS and not reader.has_audio
    for got, want in zip(decoded, frames):
        assert got.dtype == np.uint8 and got.shape == (48, 64, 3)
        np.testing.assert_array_equal(got, want)
    assert os.listdir(tmp_path) == [f"clip{ext}"]  # the temporary is gone
    (tmp_path / "plain").write_bytes(b"")
    assert os.stat(path).st_mode == os.stat(tmp_path / "plain").st_mode  # the umask's mode, not a temp file's 0600


def test_float_frames_are_rounded_and_default_codec_follows_extension(tmp_path) -> None:
    frames = torch.rand(3, 3, 16, 24, generator=torch.Generator().manual_seed(0))
    path = str(tmp_path / "float.mkv")
    write_video(path, frames, fps=25)  # .mkv -> lossless FFV1
    with av.open(path) as container:
        assert container.streams.video[0].codec_context.name == "ffv1"
    clip, fps = read_video(path)
    assert fps == 25 and clip.shape == (3, 3, 16, 24) and clip.dtype == torch.float32
    torch.testing.assert_close(clip, frames.mul(255).round().div(255), rtol=0, atol=1e-7)


@pytest.mark.parametrize("codec,ext", [("h264", ".mp4"), ("h264", ".mkv"), ("h265", ".mp4"), ("h265", ".mkv")])
def test_lossy_codecs_keep_quality_and_tags(tmp_path, codec, ext) -> None:
    frames = moving_frames(8, 96, 128)
    path = _write(tmp_path / f"clip{ext}", frames, codec=codec)
    decoded, reader = _read(path)
    assert len(decoded) == 8 and reader.fps == FPS
    psnr = min(calculate_psnr(got, want) for got, want in zip(decoded, frames))
    assert 35 < psnr < 60, psnr  # CRF 18/20 on 4:2:0 (saturated edges, the worst case): close, not lossless
    with av.open(path) as container:
        stream = container.streams.video[0]
        assert stream.codec_context.pix_fmt == "yuv420p" and stream.codec_context.colorspace == 1  # BT.709
        if codec == "h265" and ext == ".mp4":
            assert stream.codec_tag == "hvc1"


def test_lower_crf_is_closer(tmp_path) -> None:
    frames = moving_frames()
    psnr = {}
    for crf in (10, 35):
        decoded, _ = _read(_write(tmp_path / f"crf{crf}.mp4", frames, codec="h264", crf=crf))
        psnr[crf] = np.mean([calculate_psnr(g, w) for g, w in zip(decoded, frames)])
    assert psnr[10] > psnr[35] + 3, psnr


@pytest.mark.parametrize("fps,expected", [(FPS, FPS), (Fraction(30000, 1001), Fraction(30000, 1001)),
                                          ("60000/1001", Fraction(60000, 1001)), (Fraction(120000, 1001),) * 2,
                                          (25, Fraction(25)), (Fraction(1000, 3),) * 2,
                                          (29.97, Fraction(2997, 100)), (24000 / 1001, FPS)])
@pytest.mark.parametrize("ext", [".mkv", ".mp4"])
def test_frame_rate_is_kept_exactly(tmp_path, fps, expected, ext) -> None:
    path = _write(tmp_path / f"clip{ext}", moving_frames(4), fps=fps)
    with VideoReader(path) as reader:
        assert reader.fps == expected and isinstance(reader.fps, Fraction)
        assert reader.num_frames == 4


def _source_with_audio(tmp_path, ext: str, audio_codec: str, audio_ext: str, audio_format: str) -> tuple[str, int]:
    """An 8-frame video whose audio is a sine of the same duration, written by the library itself."""
    audio = str(tmp_path / f"sine{audio_ext}")
    samples = write_sine(audio, float(8 / FPS), codec=audio_codec, format_name=audio_format)
    return _write(tmp_path / f"source{ext}", moving_frames(), audio_from=audio), samples


@pytest.mark.parametrize("ext,audio_codec,audio_ext,audio_format",
                         [(".mkv", "pcm_s16le", ".wav", "wav"), (".mp4", "aac", ".m4a", "mp4"),
                          (".mkv", "flac", ".flac", "flac")])
def test_audio_is_remuxed_untouched(tmp_path, ext, audio_codec, audio_ext, audio_format) -> None:
    source, samples = _source_with_audio(tmp_path, ext, audio_codec, audio_ext, audio_format)
    decoded, reader = _read(source)
    assert reader.has_audio and len(decoded) == 8
    name, source_samples = audio_info(source)
    assert name == audio_codec and source_samples >= samples  # AAC pads to whole 1024-sample frames
    out = _write(tmp_path / "out" / f"restored{ext}", decoded, fps=reader.fps, audio_from=source)
    assert audio_packets(out) == audio_packets(source)  # remuxed, not re-encoded
    assert audio_info(out) == (audio_codec, source_samples)
    with av.open(out) as container:
        assert [s.type for s in container.streams] == ["video", "audio"]
        assert abs(float(container.duration / 1e6) - 8 / FPS) < 0.05


def test_audio_the_container_cannot_hold_is_reencoded_to_aac(tmp_path, caplog) -> None:
    source, samples = _source_with_audio(tmp_path, ".mkv", "flac", ".flac", "flac")
    with caplog.at_level(logging.WARNING):
        out = _write(tmp_path / "restored.mov", moving_frames(), audio_from=source)
    assert "re-encoded to AAC" in caplog.text and "restored.mov" in caplog.text
    name, out_samples = audio_info(out)
    assert name == "aac" and samples <= out_samples <= samples + 1024  # whole AAC frames


def test_no_audio_source_writes_video_only(tmp_path) -> None:
    silent = _write(tmp_path / "silent.mkv", moving_frames(2))
    out = _write(tmp_path / "out.mp4", moving_frames(2), audio_from=silent)
    with VideoReader(out) as reader:
        assert not reader.has_audio


def _bytes_read() -> int:
    with open("/proc/self/io") as f:  # rchar: bytes this process has read through read() calls
        return next(int(line.split()[1]) for line in f if line.startswith("rchar"))


@pytest.mark.skipif(not os.path.exists("/proc/self/io"), reason="needs Linux /proc/self/io")
def test_reading_is_lazy(tmp_path) -> None:
    frames = [np.random.default_rng(i).integers(0, 256, (48, 64, 3), dtype=np.uint8) for i in range(240)]
    path = _write(tmp_path / "long.mkv", frames)  # noise: about 2.5 MB that FFV1 cannot compress
    size = os.path.getsize(path)
    before = _bytes_read()
    with VideoReader(path) as reader:
        first = next(iter(reader))
        assert _bytes_read() - before < size // 10  # an eager reader would have read (and decoded) it all
        assert reader.decoded_frames == 1
        np.testing.assert_array_equal(first, frames[0])
        assert reader.num_frames == 240 and reader.decoded_frames == 1  # counted from packets, not decoded
        later = reader.frames(start=200)  # a second pass starts again from the beginning
        np.testing.assert_array_equal(next(later), frames[200])
        assert reader.decoded_frames == 1 + 201
        assert sum(1 for _ in later) == 39


def _text_file(tmp_path) -> str:
    path = tmp_path / "notes.mp4"
    path.write_text("not a video")
    return str(path)


def _zero_frames(tmp_path) -> str:
    path = str(tmp_path / "empty.avi")
    with av.open(path, "w") as container:
        stream = container.add_stream("ffv1", rate=25)
        stream.width, stream.height, stream.pix_fmt = 64, 48, "bgr0"
        container.start_encoding()
    return path


def _audio_only(tmp_path) -> str:
    path = str(tmp_path / "sine.m4a")
    write_sine(path, 0.1, codec="aac", format_name="mp4")
    return path


def _size_change(tmp_path) -> str:
    """PNG packets carry their own size, so a second encoder can slip 32x32 frames into a 64x48 stream."""
    path = str(tmp_path / "resized.mov")
    with av.open(path, "w") as container:
        stream = container.add_stream("png", rate=25)
        stream.width, stream.height, stream.pix_fmt = 64, 48, "rgb24"
        small = av.CodecContext.create("png", "w")
        small.width, small.height, small.pix_fmt, small.time_base = 32, 32, "rgb24", Fraction(1, 25)
        for i in range(5):
            frame = av.VideoFrame.from_ndarray(np.full((48, 64, 3) if i < 3 else (32, 32, 3), 40 * i, np.uint8),
                                               format="rgb24")
            frame.pts = i
            if i < 3:
                container.mux(stream.encode(frame))
                continue
            for packet in small.encode(frame):
                packet.stream, packet.pts, packet.dts, packet.time_base = stream, i, i, Fraction(1, 25)
                container.mux(packet)
        container.mux(stream.encode(None))
    return path


@pytest.mark.parametrize("make,expected", [
    (_text_file, "cannot open as a video"), (lambda tmp: str(tmp / "missing.mp4"), "No such file"),
    (_audio_only, "no video stream"), (_zero_frames, "zero"), (_size_change, "frame 3 is 32x32"),
])
def test_bad_video_is_one_clear_error_naming_the_file(tmp_path, make, expected) -> None:
    path = make(tmp_path)
    with pytest.raises(VideoFileError) as err:
        read_video(path)
    assert expected in _one_line_naming(err, path)
    if is_video_file(path):  # the dataset reports it when it is built, or at the latest when it reads the clip
        with pytest.raises(VideoFileError) as err:
            VideoFileTestDataset({"dataroot_lq": str(tmp_path)})[0]
        _one_line_naming(err, path)


def _odd(writer: VideoWriter) -> None:
    writer.write(np.zeros((47, 63, 3), np.uint8))


def _resize(writer: VideoWriter) -> None:
    for frame in moving_frames(2) + [np.zeros((32, 32, 3), np.uint8)]:
        writer.write(frame)


def _nothing(writer: VideoWriter) -> None:
    pass


def _bad_shape(writer: VideoWriter) -> None:
    writer.write(np.zeros((48, 64), np.uint8))


@pytest.mark.parametrize("name,fill,expected", [
    ("odd.mp4", _odd, "even frame size but the frames are 63x47; crop to 62x46 or pad to 64x48, or write "
                      "losslessly with codec='ffv1'"),
    ("resize.mkv", _resize, "frame 2 is 32x32 but the video is 64x48"),
    ("nothing.mkv", _nothing, "no frame was written"),
    ("shape.mkv", _bad_shape, "(H, W, 3)"),
])
def test_bad_frames_leave_nothing_behind(tmp_path, name, fill, expected) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.mkv").write_bytes(b"an older result")
    path = out / name
    with pytest.raises(VideoFileError) as err, VideoWriter(str(path), FPS) as writer:
        fill(writer)
    assert expected in _one_line_naming(err, path)
    assert sorted(os.listdir(out)) == ["keep.mkv"]


@pytest.mark.parametrize("name,kwargs,expected", [
    ("clip.webm", {}, "use one of .mkv, .avi, .mp4, .mov"),
    ("clip.mp4", {"codec": "ffv1"}, "ffv1 cannot be written to a .mp4 file; use .mkv or .avi"),
    ("clip.mkv", {"codec": "vp9"}, "unknown codec 'vp9'"),
    ("clip.mkv", {"crf": 10}, "crf applies to h264/h265 only"),
    ("clip.mkv", {"fps": 0}, "fps must be positive"),
])
def test_bad_writer_settings_are_one_clear_error(tmp_path, name, kwargs, expected) -> None:
    path = tmp_path / name
    with pytest.raises(VideoFileError) as err:
        VideoWriter(str(path), **{"fps": FPS, **kwargs})
    assert expected in _one_line_naming(err, path)
    assert os.listdir(tmp_path) == []


def test_failure_inside_the_with_block_or_of_the_audio_source_leaves_nothing(tmp_path) -> None:
    path = tmp_path / "clip.mkv"
    with pytest.raises(RuntimeError, match="user code"), VideoWriter(str(path), FPS) as writer:
        writer.write(moving_frames(1)[0])
        raise RuntimeError("user code failed")
    assert os.listdir(tmp_path) == []
    bad_audio = _text_file(tmp_path)
    with pytest.raises(VideoFileError) as err:
        VideoWriter(str(path), FPS, audio_from=bad_audio)
    _one_line_naming(err, bad_audio)
    assert os.listdir(tmp_path) == ["notes.mp4"]


def test_dataset_items_carry_frames_fps_and_audio(tmp_path) -> None:
    source, _ = _source_with_audio(tmp_path, ".mkv", "pcm_s16le", ".wav", "wav")
    (tmp_path / "lq").mkdir()
    os.replace(source, tmp_path / "lq" / "walk.mkv")
    gt = moving_frames(8, 96, 128)
    _write(tmp_path / "gt" / "walk.mkv", gt, fps=FPS)
    ds = VideoFileTestDataset({"dataroot_lq": str(tmp_path / "lq"), "dataroot_gt": str(tmp_path / "gt")})
    item = ds[0]
    assert item["folder"] == "walk" and item["L"].shape == (8, 3, 48, 64) and item["H"].shape == (8, 3, 96, 128)
    assert item["fps"] == FPS and item["has_audio"] and item["video_path"] == str(tmp_path / "lq" / "walk.mkv")
    np.testing.assert_array_equal((item["H"] * 255).round().byte().permute(0, 2, 3, 1).numpy(), np.stack(gt))
    assert item["lq_path"][:2] == ["walk/00000000", "walk/00000001"] and item["gt_path"] == item["lq_path"]


def test_save_video_writes_playable_mp4_or_lossless_mkv_for_odd_sizes(tmp_path, caplog) -> None:
    source, _ = _source_with_audio(tmp_path, ".mkv", "pcm_s16le", ".wav", "wav")
    frames = torch.from_numpy(np.stack(moving_frames())).permute(0, 3, 1, 2).float() / 255
    path = write_clip_video(str(tmp_path / "results"), "walk", frames, FPS, audio_from=source)
    assert path == str(tmp_path / "results" / "walk.mp4")
    with VideoReader(path) as reader:
        assert reader.fps == FPS and reader.has_audio and reader.num_frames == 8
    assert b"".join(audio_packets(path)) == b"".join(audio_packets(source))  # mp4 re-chunks PCM, same samples
    with caplog.at_level(logging.WARNING):
        odd = write_clip_video(str(tmp_path / "results"), "odd", frames[..., :47, :63], 25)
    assert odd.endswith("odd.mkv") and "odd" in caplog.text
    clip, fps = read_video(odd)
    assert fps == 25
    torch.testing.assert_close(clip, frames[..., :47, :63], rtol=0, atol=0.5 / 255)
