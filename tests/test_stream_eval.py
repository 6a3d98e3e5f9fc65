"""Streaming evaluation: frame-by-frame restoration equal to the whole-clip path, bounded memory, lazy frame
sources, segments shared over torchrun processes, resuming a killed run, one-line errors. The video runs also score
LPIPS, tOF, tLP and VMAF: a clip cut into segments (on one or two processes, or resumed after a kill) gives the
per-frame and per-clip numbers of the uninterrupted run, byte for byte (every run at the same thread count)."""

from __future__ import annotations

import contextlib
import copy
import csv
import filecmp
import io
import json
import logging
import os
import re
import shutil
import signal
import sys
import weakref
from collections.abc import Iterator

import pytest
import torch
from torch import nn

from data.dataset_video_file import VideoFileTestDataset, read_video, write_video
from data.dataset_video_test import SingleVideoRecurrentTestDataset, VideoRecurrentTestDataset
from data.frame_sources import NoisyFrames, add_noise
from engine import evaluate, scoring
from engine.eval_jobs import assign_ranks
from models import video_stream
from models.network_baseline import VideoConvBaseline
from models.network_vrt import VRT
from models.video_inference import infer_video, tile_starts
from models.video_stream import Prefetch, TensorFrames, segment_bounds, stream_video
from tests.support.helpers import ROOT, TINY_OPT, TORCHRUN_ENTRY, assert_ok, base_env, run
from tests.support.metric_data import make_weights
from tests.support.video_helpers import audio_packets, moving_frames, write_sine
from utils.utils_image import imread_rgb, imwrite_rgb

EVAL_ENTRY = os.path.join(ROOT, "tests", "support", "eval_entry.py")
TESTING = re.compile(r"^Testing (\S+)\s+\(\s*\d+/\d+\) - .*$", re.M)
AVERAGE = re.compile(r"^-- Average PSNR: .*$", re.M)
MORE = re.compile(r"^(?:Testing \S+\s+\(\s*\d+/\d+\) \+|-- Average LPIPS:) .*$", re.M)  # the non-KAIR lines
# the video runs' metrics: KAIR's four, a perceptual one, both temporal ones and VMAF (the 48 x 64 frames are too
# small for NIQE's 96 x 96 blocks)
VIDEO_METRICS = ["--metrics", "psnr", "ssim", "psnr_y", "ssim_y", "lpips", "tof", "tlp", "vmaf"]
UNVERIFIED = {"EVAL_UNVERIFIED_METRIC_WEIGHTS": "1"}  # the generated metric weights (tests/support/eval_entry.py)
# Runs compared byte for byte use one intra-op thread count (2, as users run; each torchrun process gets 2): at
# another count oneDNN sums LPIPS's and tLP's convolutions in another order and their last digits move (measured:
# metrics.csv differed at 1 vs 2 threads)
THREADS = 2


class MixNet(nn.Module):
    """Mixes neighbouring frames and pixels (a 3-D convolution) plus the clip mean: any change in the clips or
    patches a frame is restored from changes its output. ``(b, d, C, h, w) -> (b, d, 3, h*scale, w*scale)``."""

    def __init__(self, scale: int = 2, in_chans: int = 3) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(0)
        self.weight = nn.Parameter(torch.randn(3, in_chans, 3, 3, 3, generator=gen) * 0.2)
        self.scale = scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = nn.functional.conv3d(x.transpose(1, 2), self.weight, padding=1).transpose(1, 2) - x.mean()
        b, d = y.shape[:2]
        y = nn.functional.interpolate(y.flatten(0, 1), scale_factor=self.scale, mode="bilinear", align_corners=False)
        return y.view(b, d, *y.shape[1:])


class VFINet(nn.Module):
    """D frames -> 1 (a weighted mean, so the frame order matters)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = torch.arange(1.0, x.shape[1] + 1).view(1, -1, 1, 1, 1)
        return (x * w).sum(1, keepdim=True) / w.sum()


def _streamed(net, video: torch.Tensor, **kw) -> torch.Tensor:
    return torch.stack(list(stream_video(net, TensorFrames(video), **kw)))


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit for bit (``torch.equal`` takes -0.0 for 0.0)."""
    return a.shape == b.shape and torch.equal(a.contiguous().view(torch.int32), b.contiguous().view(torch.int32))


# ----------------------------------------------------------------------------------------------- the engine
CASES = {
    "tiles": (11, 4, 2, 16, 4, {}),
    "pad_seq": (11, 4, 2, 16, 4, {"pad_seq": True}),
    "no_overlap": (10, 5, 0, 0, 4, {}),
    "center": (12, 3, 1, 8, 2, {"center_frame_only": True}),
    "center_pad": (8, 3, 1, 0, 2, {"center_frame_only": True, "pad_seq": True}),
    "flip_fallback": (7, 3, 2, 16, 6, {"flip_seq": True}),
    "whole_sequence": (9, 0, 2, 16, 4, {}),
    "shorter_than_a_tile": (3, 6, 2, 0, 4, {}),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_stream_equals_the_whole_clip_bit_for_bit(case, one_thread) -> None:
    n, nft, nfo, patch, overlap, extra = CASES[case]
    net = MixNet(scale=2)
    video = torch.rand(n, 3, 24, 32, generator=torch.Generator().manual_seed(1))
    kw = {"scale": 2, "window_size": (2, 8, 8), "num_frame_testing": nft, "num_frame_overlapping": nfo,
          "size_patch_testing": patch, "overlap_size": overlap, **extra}
    whole = infer_video(net, video[None], **kw)[0]
    assert _same_bits(_streamed(net, video, **kw), whole)
    assert _same_bits(_streamed(net, video, prefetch=3, **kw), whole)
    # segments restored apart concatenate to the whole output; the tiles are not a no-op for this net
    bounds = segment_bounds(n, 2, num_frame_testing=nft, num_frame_overlapping=nfo, **extra)
    parts = [_streamed(net, video, start=a, stop=b, **kw) for a, b in bounds]
    assert _same_bits(torch.cat(parts), whole)
    if nft and not extra and n > nft:
        assert (infer_video(net, video[None], **{**kw, "num_frame_testing": 0})[0] - whole).abs().max() > 1e-3
        assert len(bounds) > 1


def test_frames_handed_out_one_clip_late_are_the_same(monkeypatch) -> None:
    """The CUDA order (a clip's frames handed out after the next clip is queued), run on the CPU."""
    monkeypatch.setattr(video_stream, "_pipelined", lambda device: True)
    source = CountingFrames(23)
    kw = {"scale": 1, "window_size": (1, 8, 8), "num_frame_testing": 5, "num_frame_overlapping": 2}
    ahead = []
    out = []
    for index, frame in enumerate(stream_video(MixNet(scale=1), source, **kw)):
        ahead.append(source.read - (index + 1))
        out.append(frame)
    whole = infer_video(MixNet(scale=1), torch.stack(list(source.frames()))[None], **kw)[0]
    assert _same_bits(torch.stack(out), whole)
    assert max(ahead) <= 2 * 5  # one clip more than without the lag


def test_negative_zeros_are_summed_as_the_whole_clip_sums_them() -> None:
    """A tile output of -0.0 becomes 0.0 in the whole-clip sum (0.0 + -0.0); the stream keeps those bits."""
    class NegZero(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return -(x[:, :, :3] * 0)

    video = torch.rand(6, 3, 8, 8)
    kw = {"scale": 1, "window_size": (1, 8, 8), "num_frame_testing": 3, "num_frame_overlapping": 1}
    whole = infer_video(NegZero(), video[None], **kw)[0]
    assert _same_bits(_streamed(NegZero(), video, **kw), whole) and not torch.signbit(whole).any()


def test_stream_vfi_and_nonblind_denoising_equal_the_whole_clip() -> None:
    video = torch.rand(4, 3, 16, 16, generator=torch.Generator().manual_seed(2))
    kw = {"scale": 1, "window_size": (4, 8, 8), "vfi": True, "size_patch_testing": 8, "overlap_size": 2}
    assert _same_bits(_streamed(VFINet(), video, **kw), infer_video(VFINet(), video[None], **kw)[0])
    noisy = torch.cat([video, torch.full_like(video[:, :1], 0.1)], 1)
    net = MixNet(scale=1, in_chans=4)
    kw = {"scale": 1, "window_size": (2, 8, 8), "num_frame_testing": 3, "num_frame_overlapping": 1,
          "size_patch_testing": 8, "overlap_size": 2, "in_chans": 4}
    assert _same_bits(_streamed(net, noisy, **kw), infer_video(net, noisy[None], **kw)[0])
    with pytest.raises(ValueError, match="reads 4 input channels, the input has 3"):
        list(stream_video(net, TensorFrames(video), **kw))


def test_stream_with_a_tiny_vrt_equals_infer_video(one_thread) -> None:
    torch.manual_seed(0)
    net = VRT(upscale=4, img_size=[2, 40, 40], window_size=[2, 4, 4], depths=[1] * 8, indep_reconsts=[],
              embed_dims=[8] * 8, num_heads=[1] * 8, pa_frames=2, deformable_groups=1, spynet_path=None).eval()
    video = torch.rand(4, 3, 40, 48, generator=torch.Generator().manual_seed(3))
    kw = {"scale": 4, "window_size": (2, 4, 4), "num_frame_testing": 2, "num_frame_overlapping": 1,
          "size_patch_testing": 40, "overlap_size": 16}
    with torch.inference_mode():
        assert _same_bits(_streamed(net, video, **kw), infer_video(net, video[None], **kw)[0])


class CountingFrames:
    """A frame source that records how far it has been read and keeps weak references to what it handed out."""

    def __init__(self, count: int, size: int = 8) -> None:
        self.count, self.size, self.name = count, size, "counting"
        self.read = 0
        self.handed: list[weakref.ref] = []

    def __len__(self) -> int:
        return self.count

    def frames(self, start: int = 0):
        for i in range(start, self.count):
            frame = torch.full((3, self.size, self.size), (i % 7) / 7)
            self.handed.append(weakref.ref(frame))
            self.read = i + 1
            yield frame

    def alive(self) -> int:
        return sum(ref() is not None for ref in self.handed)


@pytest.mark.parametrize("length", [40, 400])
def test_memory_is_bounded_by_a_tile_whatever_the_length(length) -> None:
    nft, nfo = 6, 2
    source = CountingFrames(length)
    ahead, alive = [], []
    for index, _frame in enumerate(stream_video(MixNet(scale=1), source, scale=1, window_size=(1, 8, 8),
                                                num_frame_testing=nft, num_frame_overlapping=nfo)):
        ahead.append(source.read - (index + 1))  # input frames read beyond the output frames returned
        alive.append(source.alive())
    assert len(ahead) == length
    assert max(ahead) <= nft and max(alive) <= nft + 1  # one tile, the same for 40 and 400 frames
    assert source.alive() == 0


def test_a_source_that_breaks_its_word_is_named() -> None:
    class Short(TensorFrames):
        def __len__(self) -> int:
            return 6

    kw = {"scale": 1, "window_size": (1, 8, 8), "num_frame_testing": 3, "num_frame_overlapping": 1}
    with pytest.raises(ValueError, match=r"clip\.avi: the frames end at frame 4, but the source states 6"):
        list(stream_video(MixNet(scale=1), Short(torch.rand(4, 3, 8, 8), "clip.avi"), **kw))
    with pytest.raises(ValueError, match="more frames than the 3"):
        list(stream_video(MixNet(scale=1), _Lying(torch.rand(5, 3, 8, 8)), **kw))
    mixed = [torch.rand(3, 8, 8), torch.rand(3, 8, 8), torch.rand(3, 8, 16)]
    with pytest.raises(ValueError, match=r"frame 2 is \(3, 8, 16\)"):
        list(stream_video(MixNet(scale=1), _ListFrames(mixed), **kw))


class _Lying(TensorFrames):
    def __len__(self) -> int:
        return 3


class _ListFrames:
    def __init__(self, frames) -> None:
        self.list, self.name = frames, "list"

    def __len__(self) -> int:
        return len(self.list)

    def frames(self, start: int = 0):
        return iter(self.list[start:])


def test_prefetch_hands_over_errors_and_stops_its_thread() -> None:
    def broken():
        yield torch.zeros(1)
        raise ValueError("frame 1 of clip.mp4 is unreadable")

    reader = Prefetch(broken(), 2)
    assert next(reader).shape == (1,)
    with pytest.raises(ValueError, match="clip.mp4"):
        next(reader)
    endless = Prefetch(iter(lambda: torch.zeros(1), None), 2)
    next(endless)
    endless.close()
    assert not endless._thread.is_alive()


def test_segments_cut_at_tile_ends_and_ranks_get_contiguous_shares() -> None:
    n, nft, nfo = 103, 10, 2
    bounds = segment_bounds(n, 25, num_frame_testing=nft, num_frame_overlapping=nfo)
    assert bounds[0][0] == 0 and bounds[-1][1] == n and all(a[1] == b[0] for a, b in zip(bounds, bounds[1:]))
    ends = {s + nft for s in tile_starts(n, nft, nfo)}
    assert all(b in ends for _, b in bounds[:-1]) and all(b - a <= 25 for a, b in bounds)
    assert segment_bounds(n, 25, num_frame_testing=0, num_frame_overlapping=nfo) == [(0, n)]
    assert segment_bounds(n, 25, num_frame_testing=nft, num_frame_overlapping=nfo, flip_seq=True) == [(0, n)]
    assert segment_bounds(n, 3, num_frame_testing=nft, num_frame_overlapping=nfo)[0] == (0, 10)  # tiles are longer
    owners = assign_ranks([4, 3, 4, 1, 3], 2)
    assert owners == sorted(owners) and set(owners) == {0, 1}
    assert assign_ranks([10] * 8, 3) == [0, 0, 0, 1, 1, 2, 2, 2]
    assert len(assign_ranks([5], 4)) == 1


# ----------------------------------------------------------------------------------------------- lazy frames
@pytest.mark.parametrize("shape", [(7, 3, 5, 5), (9, 3, 3, 7), (4, 3, 2, 2), (17, 3, 8, 8), (1, 3, 5, 5)])
def test_noise_drawn_frame_by_frame_equals_the_whole_clip_draw(shape) -> None:
    gt = torch.rand(shape, generator=torch.Generator().manual_seed(4))
    whole = add_noise(gt, 0.2, seed=5)
    noisy = NoisyFrames(TensorFrames(gt), 0.2, seed=5)
    for start in sorted({0, min(1, shape[0] - 1), shape[0] // 2, shape[0] - 1}):
        assert torch.equal(torch.stack(list(noisy.frames(start))), whole[start:]), start


def _write_clips(root, clips, size=(24, 20), scale=4, seed=0) -> None:
    gen = torch.Generator().manual_seed(seed)
    for clip, frames in clips.items():
        gt = torch.rand(frames, 3, size[0] * scale, size[1] * scale, generator=gen)
        lq = torch.nn.functional.interpolate(gt, scale_factor=1 / scale, mode="bilinear", align_corners=False)
        for t in range(frames):
            imwrite_rgb(os.path.join(root, "gt", clip, f"{t:08d}.png"), gt[t])
            imwrite_rgb(os.path.join(root, "lq", clip, f"f{t:03d}.png"), lq[t].clamp(0, 1))


def _lazy_equals_item(dataset) -> None:
    for index in range(len(dataset)):
        item, lazy = dataset[index], dataset.lazy_item(index)
        assert {k: v for k, v in item.items() if k not in ("L", "H")} == \
            {k: v for k, v in lazy.items() if k not in ("L", "H")}
        for key in ("L", "H"):
            if key in item:
                assert len(lazy[key]) == item[key].shape[0]
                assert torch.equal(torch.stack(list(lazy[key].frames())), item[key])
                assert torch.equal(torch.stack(list(lazy[key].frames(1))), item[key][1:])


def test_lazy_items_equal_the_whole_items(tmp_path) -> None:
    _write_clips(str(tmp_path), {"a": 3, "b": 2}, size=(6, 5), scale=2)
    lq, gt = str(tmp_path / "lq"), str(tmp_path / "gt")
    _lazy_equals_item(VideoRecurrentTestDataset({"dataroot_lq": lq, "dataroot_gt": gt}))
    _lazy_equals_item(VideoRecurrentTestDataset({"dataroot_lq": lq, "dataroot_gt": gt, "cache_data": True}))
    _lazy_equals_item(VideoRecurrentTestDataset({"dataroot_gt": gt, "sigma": 30, "noise_seed_per_clip": True}))
    _lazy_equals_item(SingleVideoRecurrentTestDataset({"dataroot_lq": lq, "sigma": 10}))
    video = torch.rand(4, 3, 8, 10, generator=torch.Generator().manual_seed(6))
    write_video(str(tmp_path / "v" / "clip.avi"), video, fps=25)
    write_video(str(tmp_path / "g" / "clip.avi"), video.flip(0), fps=25)
    _lazy_equals_item(VideoFileTestDataset({"dataroot_lq": str(tmp_path / "v"), "dataroot_gt": str(tmp_path / "g")}))
    _lazy_equals_item(VideoFileTestDataset({"dataroot_lq": str(tmp_path / "v"), "dataroot_gt": str(tmp_path / "g"),
                                            "sigma": 15}))


# ----------------------------------------------------------------------------------------------- end to end
@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    """A tiny videoconvbaseline checkpoint (its (3,3,3) convolution mixes frames) with tiles of 4 frames and
    8-pixel patches; three clip folders (7, 5, 3 frames) and a 23-frame video pair with audio."""
    tmp = tmp_path_factory.mktemp("stream")
    opt = copy.deepcopy(TINY_OPT)
    opt["netG"] = {"net_type": "videoconvbaseline", "upscale": 4, "num_feat": 8, "num_block": 1}
    opt["val"] = {"num_frame_testing": 4, "num_frame_overlapping": 2, "size_patch_testing": 8, "overlap_size": 4}
    opt["path"]["root"] = str(tmp / "experiments")
    (tmp / "opt.json").write_text(json.dumps(opt))
    torch.manual_seed(0)
    ckpt = tmp / "experiments" / "tiny" / "models" / "5_G.pth"
    ckpt.parent.mkdir(parents=True)
    torch.save({"params": VideoConvBaseline(upscale=4, num_feat=8, num_block=1).state_dict()}, ckpt)
    _write_clips(str(tmp), {"000": 7, "001": 5, "002": 3}, size=(12, 10))
    gt = torch.stack([torch.from_numpy(f).permute(2, 0, 1) for f in moving_frames(23, 48, 64)]).float() / 255
    lq = torch.nn.functional.interpolate(gt, scale_factor=0.25, mode="bilinear", align_corners=False).clamp(0, 1)
    write_sine(str(tmp / "long.wav"), 23 / 25)
    write_video(str(tmp / "vgt" / "long.avi"), gt, fps=25)
    write_video(str(tmp / "vlq" / "long.avi"), lq, fps=25, audio_from=str(tmp / "long.wav"))
    make_weights(str(tmp / "metric_weights"))
    verify, scoring.VERIFY_WEIGHTS = scoring.VERIFY_WEIGHTS, False  # the in-process runs load them too
    yield tmp
    scoring.VERIFY_WEIGHTS = verify


def _args(ws, kind: str, save_dir: str, *extra: str) -> list[str]:
    inputs = {"folders": ["--folder_lq", str(ws / "lq"), "--folder_gt", str(ws / "gt")],
              "video": ["--folder_lq", str(ws / "vlq" / "long.avi"), "--folder_gt", str(ws / "vgt" / "long.avi"),
                        "--save_video", *VIDEO_METRICS, "--metric_weights", str(ws / "metric_weights")]}[kind]
    return ["--opt", str(ws / "opt.json"), *inputs, "--save_result", "--num_workers", "0", "--save_dir",
            str(ws / save_dir), *extra]


@contextlib.contextmanager
def _threads(count: int = THREADS) -> Iterator[None]:
    """This process's intra-op threads, as the launched runs that it is compared with have them."""
    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _single(ws, args: list[str], **env: str):
    return run([sys.executable, EVAL_ENTRY, *args], base_env(threads=THREADS, **UNVERIFIED, **env), str(ws),
               timeout=240)


def _in_process(args: list[str]) -> str:
    """Run ``main_test_vrt.py`` in this process (a single-process reference, without the start-up cost); returns
    what it logged, as the entry script prints it."""
    assert not any(k in os.environ for k in ("RANK", "WORLD_SIZE"))
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(message)s"))
    root = logging.getLogger()
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    try:
        with _threads():
            assert evaluate.main([*args, "--device", "cpu"]) == 0, stream.getvalue()
    finally:
        root.removeHandler(handler)
        root.setLevel(level)
    return stream.getvalue()


def _two(ws, args: list[str], **env: str):
    cmd = [sys.executable, TORCHRUN_ENTRY, "--standalone", "--nproc_per_node=2", EVAL_ENTRY, *args]
    proc = run(cmd, base_env(threads=THREADS, **UNVERIFIED, **env), str(ws), timeout=240)
    if proc.returncode != 0 and "timed out connecting" in proc.stderr:
        proc = run(cmd, base_env(threads=THREADS, **UNVERIFIED, **env), str(ws), timeout=240)  # a gloo rendezvous flake
    return proc


def _same_outputs(a, b, clips) -> None:
    """Every PNG byte for byte, metrics.csv and clips.csv byte for byte."""
    for clip in clips:
        names = sorted(os.listdir(a / clip))
        assert names and names == sorted(os.listdir(b / clip))
        match, mismatch, errors = filecmp.cmpfiles(a / clip, b / clip, names, shallow=False)
        assert not mismatch and not errors, (clip, mismatch, errors)
    for name in ("metrics.csv", "clips.csv"):
        assert (a / name).read_bytes() == (b / name).read_bytes(), name


def _video_matches_pngs(save_dir) -> None:
    """``<save_dir>/long.mp4`` (H.264, 25 fps) holds the restored frames (the PNGs), each in its place."""
    frames, fps = read_video(str(save_dir / "long.mp4"))
    names = sorted(os.listdir(save_dir / "long"))
    pngs = torch.stack([torch.from_numpy(imread_rgb(str(save_dir / "long" / n))).permute(2, 0, 1) for n in names])
    assert frames.shape == pngs.shape == (23, 3, 48, 64) and fps == 25
    errors = ((frames[:, None] - pngs[None]) ** 2).mean(dim=(2, 3, 4))  # (video frame, PNG)
    # above 17 dB (the untrained network's noisy output is hard for H.264 at 64x48), and as near its own PNG as any
    # other within 10%: some neighbouring outputs of the untrained network are as near each other as the codec's
    # noise (video frame 1 against PNGs 1 and 2: 0.0122 and 0.0122, its own 0.996-1.005x the nearest other), while
    # frames 0 and 1 swapped are 1.38x and 2.4x, and most frames of a video shifted by one 1.25-2.9x
    assert bool((errors.diagonal() < 0.02).all()), errors.diagonal()
    ratio = errors.diagonal() / errors.min(dim=1).values
    assert bool((ratio <= 1.1).all()), ratio


def _markers(save_dir) -> list[dict]:
    state = save_dir / ".eval_state"
    return [json.loads(p.read_text()) for p in sorted(state.rglob("*.json"))
            if p.name not in ("video.json", "vmaf.json")]


@pytest.fixture(scope="module")
def video_reference(workspace) -> str:
    return _in_process(_args(workspace, "video", "video_one"))


@pytest.fixture(scope="module")
def folders_reference(workspace) -> str:
    return _in_process(_args(workspace, "folders", "folders_one", "--segment_frames", "3"))


def test_two_processes_equal_one_on_clip_folders(workspace, folders_reference) -> None:
    one = folders_reference
    two = _two(workspace, _args(workspace, "folders", "folders_two", "--segment_frames", "3"))
    assert_ok(two)
    _same_outputs(workspace / "folders_one", workspace / "folders_two", ["000", "001", "002"])
    assert TESTING.findall(two.stdout) == ["000", "001", "002"]  # each clip once, in order, by rank 0
    assert len(AVERAGE.findall(two.stdout)) == 1
    assert TESTING.findall(one) == ["000", "001", "002"]
    lines = [m.group(0) for m in TESTING.finditer(one)] + AVERAGE.findall(one)
    assert lines == [m.group(0) for m in TESTING.finditer(two.stdout)] + AVERAGE.findall(two.stdout)
    markers = _markers(workspace / "folders_two")
    assert len(markers) == 5 and {m["rank"] for m in markers} == {0, 1}  # the segments were shared out
    assert "Restored 15 frames in" in one and re.search(r"Restored 15 frames in .* with 2 processes", two.stdout)
    assert re.search(r"00[012]: .*frame/s", two.stderr)  # rank 0's progress bars


def test_long_video_split_over_two_processes_equals_one(workspace, video_reference) -> None:
    two = _two(workspace, _args(workspace, "video", "video_two"))
    assert_ok(two)
    one_dir, two_dir = workspace / "video_one", workspace / "video_two"
    _same_outputs(one_dir, two_dir, ["long"])
    markers = _markers(two_dir)
    assert [(m["segment"], m["rank"]) for m in markers] == [("0-12", 0), ("12-23", 1)]
    assert [m["segment"] for m in _markers(one_dir)] == ["0-23"]
    # the video assembled from two lossless parts holds the frames in order, like the one written directly (x264
    # itself is not bit-reproducible from run to run, so the H.264 frames are compared with the exact PNGs)
    _video_matches_pngs(one_dir)
    _video_matches_pngs(two_dir)
    audio = b"".join(audio_packets(str(workspace / "long.wav")))
    assert b"".join(audio_packets(str(one_dir / "long.mp4"))) == b"".join(audio_packets(str(two_dir / "long.mp4"))) \
        == audio
    assert not list((two_dir / ".eval_state").rglob("*.mkv"))  # parts removed once assembled
    assert TESTING.findall(two.stdout) == ["long"] and len(AVERAGE.findall(two.stdout)) == 1
    # the temporal metrics look across the segment border: frame 12 (rank 1's first) has them, frame 0 has none
    rows = list(csv.DictReader(open(two_dir / "metrics.csv")))
    assert rows[0]["tof"] == rows[0]["tlp"] == "" and all(r["tof"] and r["tlp"] and r["vmaf"] for r in rows[1:])
    assert MORE.findall(two.stdout) == MORE.findall(video_reference) and len(MORE.findall(two.stdout)) == 2
    assert not list((two_dir / ".eval_state").rglob("*.y"))  # VMAF's luma spools removed once the clip is scored


def test_killed_run_resumes_to_the_uninterrupted_result(workspace, video_reference, caplog, monkeypatch) -> None:
    args = _args(workspace, "video", "video_resumed", "--segment_frames", "5")
    killed = _single(workspace, args, EVAL_KILL_AFTER_FRAMES="6")
    assert killed.returncode == -9, killed.stdout + killed.stderr
    save_dir = workspace / "video_resumed"
    assert [m["segment"] for m in _markers(save_dir)] == ["0-4"]  # frames 4 and 5 of 4-8 on disk, no marker
    assert len(os.listdir(save_dir / "long")) == 6 and list((save_dir / ".eval_state").rglob(".*.tmp*"))
    resumed = _single(workspace, args)
    assert_ok(resumed)
    assert "1 segment(s) already complete" in resumed.stdout and "Restored 19 frames" in resumed.stdout
    _same_outputs(workspace / "video_one", save_dir, ["long"])
    _video_matches_pngs(save_dir)
    assert not [p for p in save_dir.rglob("*") if ".tmp" in p.name]
    assert [m.group(0) for m in TESTING.finditer(resumed.stdout)] == \
        [m.group(0) for m in TESTING.finditer(video_reference)]
    assert AVERAGE.findall(resumed.stdout) == AVERAGE.findall(video_reference)
    assert MORE.findall(resumed.stdout) == MORE.findall(video_reference)
    for key in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("VRT_DEVICE", "cpu")
    with caplog.at_level(logging.INFO), _threads():
        assert evaluate.main(args) == 0  # everything complete: nothing is restored, the same report
    assert "Restored 0 frames" in caplog.text
    assert AVERAGE.findall(caplog.text) == AVERAGE.findall(resumed.stdout)
    caplog.clear()
    with caplog.at_level(logging.INFO), _threads():  # another spatial overlap: the same segments, not the same outputs
        assert evaluate.main([*args, "--tile_overlap", "2", "6"]) == 0
    assert "restored by a different command" in caplog.text and "Restored 23 frames" in caplog.text


def test_bad_frame_on_one_rank_is_one_error_line(workspace, tmp_path) -> None:
    for side in ("lq", "gt"):
        shutil.copytree(workspace / side, tmp_path / side)
    bad = tmp_path / "lq" / "002" / "f002.png"
    bad.write_bytes(b"not a png")
    args = ["--opt", str(workspace / "opt.json"), "--folder_lq", str(tmp_path / "lq"), "--folder_gt",
            str(tmp_path / "gt"), "--num_workers", "0", "--save_dir", str(tmp_path / "out"), "--segment_frames", "3"]
    two = _two(workspace, args)
    assert two.returncode != 0
    errors = [line for line in two.stdout.splitlines() if "error:" in line]
    assert len(errors) == 1 and str(bad) in errors[0] and "[rank 1]" in errors[0], two.stdout
    assert "Average" not in two.stdout


def test_bad_inputs_in_one_process_are_one_error_line(workspace, tmp_path, caplog, monkeypatch) -> None:
    for key in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
        monkeypatch.delenv(key, raising=False)
    shutil.copytree(workspace / "lq", tmp_path / "lq")
    bad = tmp_path / "lq" / "000" / "f004.png"
    imwrite_rgb(str(bad), torch.rand(3, 14, 10))  # a frame of another size, in the middle of the clip
    common = ["--opt", str(workspace / "opt.json"), "--num_workers", "0", "--device", "cpu"]
    with caplog.at_level(logging.ERROR):
        code = evaluate.main([*common, "--folder_lq", str(tmp_path / "lq"), "--save_dir", str(tmp_path / "a")])
    assert code == 2
    assert len(caplog.records) == 1 and str(bad) in caplog.text and "one size" in caplog.text
    caplog.clear()
    short = torch.rand(3, 3, 12, 16)
    write_video(str(tmp_path / "short.avi"), short, fps=25)
    with caplog.at_level(logging.ERROR):
        code = evaluate.main([*common, "--folder_lq", str(workspace / "vlq" / "long.avi"), "--folder_gt",
                              str(tmp_path / "short.avi"), "--save_dir", str(tmp_path / "b")])
    assert code == 2 and len(caplog.records) == 1
    assert "long.avi has 23 frames but its GT" in caplog.text and "short.avi has 3" in caplog.text


def test_option_file_centre_frame_rule_restores_and_scores_the_centre_frame(workspace, folders_reference) -> None:
    """``val.center_frame_only``: one output per clip, frame D // 2, from the tiles that cover it only, so it equals
    that frame of the full run; scored against GT frame D // 2."""
    _in_process([*_args(workspace, "folders", "centre"), "--set", "val.center_frame_only=true"])
    rows = list(csv.DictReader(open(workspace / "centre" / "metrics.csv")))
    assert [(r["folder"], r["frame"]) for r in rows] == [("000", "f003"), ("001", "f002"), ("002", "f001")]
    full = {(r["folder"], r["frame"]): r for r in csv.DictReader(open(workspace / "folders_one" / "metrics.csv"))}
    assert rows == [full[(r["folder"], r["frame"])] for r in rows]
    for clip, frame in (("000", "f003"), ("002", "f001")):
        assert filecmp.cmp(workspace / "centre" / clip / f"{frame}.png", workspace / "folders_one" / clip /
                           f"{frame}.png", shallow=False)


def test_metrics_csv_rows_follow_the_frames(workspace, video_reference) -> None:
    rows = list(csv.DictReader(open(workspace / "video_one" / "metrics.csv")))
    assert [r["frame"] for r in rows] == [f"{i:08d}" for i in range(23)] and {r["folder"] for r in rows} == {"long"}


def test_lossless_video_codec_holds_the_pngs_bit_for_bit(workspace, video_reference, caplog, monkeypatch) -> None:
    """``--video_codec ffv1`` (one segment, and assembled from two): the video's frames are the PNGs exactly; a
    quality setting for a lossless codec is one error line naming the flags, and writes nothing."""
    for key in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("VRT_DEVICE", "cpu")
    for name, extra in (("ffv1_one", []), ("ffv1_split", ["--segment_frames", "8"])):
        with _threads():  # compared with video_one below
            assert evaluate.main([*_args(workspace, "video", name, "--video_codec", "ffv1"), *extra]) == 0
        frames, fps = read_video(str(workspace / name / "long.mkv"))
        pngs = sorted(os.listdir(workspace / name / "long"))
        expected = torch.stack([torch.from_numpy(imread_rgb(str(workspace / name / "long" / n))).permute(2, 0, 1)
                                for n in pngs])
        assert fps == 25 and torch.equal((frames * 255).round(), (expected * 255).round()), name
        assert not (workspace / name / "long.mp4").exists()
    _same_outputs(workspace / "video_one", workspace / "ffv1_split", ["long"])
    caplog.clear()
    with caplog.at_level(logging.ERROR):
        code = evaluate.main(_args(workspace, "video", "ffv1_crf", "--video_codec", "ffv1", "--video_crf", "10"))
    assert code == 2 and len(caplog.records) == 1 and "--video_crf 10" in caplog.text and "lossless" in caplog.text
    assert not (workspace / "ffv1_crf").exists()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_stream_on_cuda_equals_infer_video_on_cuda() -> None:
    """Device-side accumulation and pinned copies give the bits of the CPU-blended whole-clip path."""
    device = torch.device("cuda")
    net = MixNet(scale=2).to(device)
    video = torch.rand(11, 3, 24, 32, generator=torch.Generator().manual_seed(1))
    kw = {"scale": 2, "window_size": (2, 8, 8), "num_frame_testing": 4, "num_frame_overlapping": 2,
          "size_patch_testing": 16, "overlap_size": 4, "device": device}
    whole = infer_video(net, video[None], **kw)[0]
    assert _same_bits(_streamed(net, video, prefetch=4, **kw), whole)
    assert _same_bits(_streamed(net, video, start=3, stop=9, **kw), whole[3:9])


def test_noisy_video_without_gt_gets_the_sigma_map(tmp_path) -> None:
    """Non-blind denoising of an already noisy video (no GT): the dataset appends the noise-level map, read lazily
    or whole, as the clip-folder sets do."""
    video = torch.rand(3, 3, 8, 10, generator=torch.Generator().manual_seed(2))
    write_video(str(tmp_path / "v" / "noisy.avi"), video, fps=25)
    dataset = VideoFileTestDataset({"dataroot_lq": str(tmp_path / "v"), "sigma": 20})
    item = dataset[0]
    assert item["L"].shape == (3, 4, 8, 10) and "H" not in item
    assert torch.equal(item["L"][:, 3], torch.full((3, 8, 10), 20 / 255))
    assert torch.equal(item["L"][:, :3], read_video(str(tmp_path / "v" / "noisy.avi"))[0])
    _lazy_equals_item(dataset)


def test_tiny_vrt_on_two_processes_at_two_threads_equals_one(tmp_path) -> None:
    """The promise where users stand: a real (tiny) VRT denoiser, 2 intra-op threads, real processes. Clips cut
    into segments and shared over 2 torchrun processes give the PNGs, metrics.csv and log lines of 1 process."""
    from models.select_network import define_G
    from tests.support.helpers import VRT_TINY_OPT

    opt = copy.deepcopy(VRT_TINY_OPT)
    opt["val"] = {"num_frame_testing": 4, "num_frame_overlapping": 2, "size_patch_testing": 0}
    opt["path"]["root"] = str(tmp_path / "experiments")
    (tmp_path / "opt.json").write_text(json.dumps(opt))
    torch.manual_seed(0)
    weights = tmp_path / "vrt_G.pth"
    torch.save({"params": define_G(opt).state_dict()}, weights)
    gen = torch.Generator().manual_seed(3)
    for clip, frames in (("a", 7), ("b", 5)):
        for t, frame in enumerate(torch.rand(frames, 3, 40, 40, generator=gen)):
            imwrite_rgb(str(tmp_path / "gt" / clip / f"{t:08d}.png"), frame)
    common = ["--opt", str(tmp_path / "opt.json"), "--model_path", str(weights), "--folder_lq", str(tmp_path / "gt"),
              "--folder_gt", str(tmp_path / "gt"), "--sigma", "30", "--save_result", "--num_workers", "0",
              "--segment_frames", "3"]
    env = base_env(threads=2)
    one = run([sys.executable, EVAL_ENTRY, *common, "--save_dir", str(tmp_path / "one")], env, str(tmp_path),
              timeout=300)
    assert_ok(one)
    two = run([sys.executable, TORCHRUN_ENTRY, "--standalone", "--nproc_per_node=2", EVAL_ENTRY, *common,
               "--save_dir", str(tmp_path / "two")], env, str(tmp_path), timeout=300)
    assert_ok(two)
    _same_outputs(tmp_path / "one", tmp_path / "two", ["a", "b"])
    assert [m.group(0) for m in TESTING.finditer(one.stdout)] == [m.group(0) for m in TESTING.finditer(two.stdout)]
    assert AVERAGE.findall(one.stdout) == AVERAGE.findall(two.stdout) and len(AVERAGE.findall(two.stdout)) == 1
    assert {m["rank"] for m in _markers(tmp_path / "two")} == {0, 1}  # both processes restored segments


def test_a_stop_signal_to_the_process_group_keeps_the_complete_segments(workspace, video_reference) -> None:
    """SIGTERM to every process of the job at once (``timeout``, ``scancel``, ``kill -TERM -- -PGID``) in the middle
    of a segment: the run ends with one line and exit 143, the complete segments keep their markers, and the re-run
    finishes to the uninterrupted result."""
    args = _args(workspace, "video", "video_signalled", "--segment_frames", "5")
    env = base_env(threads=THREADS, **UNVERIFIED, EVAL_SIGNAL_GROUP_AFTER_FRAMES="6")
    stopped = run([sys.executable, EVAL_ENTRY, *args], env, str(workspace), timeout=240, new_session=True)
    assert stopped.returncode == 128 + signal.SIGTERM, stopped.stdout + stopped.stderr
    assert "Stopped by SIGTERM: the complete segments are kept; re-run the same command" in stopped.stdout
    assert "Traceback" not in stopped.stderr, stopped.stderr
    save_dir = workspace / "video_signalled"
    assert [m["segment"] for m in _markers(save_dir)] == ["0-4"]
    resumed = _single(workspace, args)
    assert_ok(resumed)
    assert "1 segment(s) already complete" in resumed.stdout
    names = sorted(os.listdir(save_dir / "long"))
    assert len(names) == 23 and names == sorted(os.listdir(workspace / "video_one" / "long"))
    assert not filecmp.cmpfiles(workspace / "video_one" / "long", save_dir / "long", names, shallow=False)[1]
    assert AVERAGE.findall(resumed.stdout) == AVERAGE.findall(video_reference)
