"""Training from video files: frame-accurate seeking on H.264 with B-frames, clips inside one file and one scene,
the frame-index cache, bad files reported up front, the same items in any loader layout, paired LQ/GT videos and
the synthetic videos written when the data folder is missing."""

from __future__ import annotations

import copy
import json
import logging
import os
from fractions import Fraction

import av
import numpy as np
import pytest
import torch
from av.video.frame import PictureType

from data.dataset_video_file import read_video
from data.dataset_video_file_train import VideoFileTrainDataset
from data.select_dataset import define_Dataset
from data.synthetic_videos import synthesize_videos
from data.video_frame_index import VideoClipReader, index_cache_path, load_index, scan_video
from tests.support.helpers import TINY_OPT, assert_ok, base_env, reports, torchrun, write_opt
from tests.support.video_helpers import moving_frames
from utils.utils_dataloader import ResumableSampler, SeededItems, build_train_loader
from utils.utils_option import OptionError
from utils.utils_video import DataCheckError
from utils.utils_video_file import VideoFileError, VideoReader

SIZE = 64  # frames are SIZE x SIZE; the top-left 16 x 16 block holds the frame number as a grey level
X264 = "keyint={keyint}:min-keyint={keyint}:bframes=3:b-adapt=0:scenecut=0:open-gop={open_gop}"


def _write_h264(path, frames, keyint: int = 12, open_gop: int = 0, crf: int = 10) -> str:
    """H.264 with three B-frames between references (forced) and a keyframe every ``keyint`` frames."""
    with av.open(str(path), "w") as container:
        stream = container.add_stream("libx264", rate=Fraction(24000, 1001), options={
            "x264-params": X264.format(keyint=keyint, open_gop=open_gop), "crf": str(crf)})
        stream.width, stream.height, stream.pix_fmt = frames[0].shape[1], frames[0].shape[0], "yuv420p"
        for i, img in enumerate(frames):
            frame = av.VideoFrame.from_ndarray(img, format="rgb24")
            frame.pts = i
            container.mux(stream.encode(frame))
        container.mux(stream.encode(None))
    return str(path)


def _numbered(count: int, cut: int | None = None, size: int = SIZE) -> list[np.ndarray]:
    """Moving content with frame ``t``'s number in the top-left block (level 16 + 8 t); from frame ``cut`` on, the
    content is three times darker (a scene cut: its colour histogram jumps)."""
    frames = moving_frames(count, size, size)
    for t, img in enumerate(frames):
        if cut is not None and t >= cut:
            img[:] = img // 3
        img[:size // 4, :size // 4] = 16 + 8 * t
    return frames


def _numbers(clip: torch.Tensor) -> list[int]:
    """Frame numbers of a ``(T, 3, H, W)`` clip made of :func:`_numbered` frames (not cropped, not flipped)."""
    block = clip.shape[-1] // 16
    levels = clip[:, :, block:3 * block, block:3 * block].mean(dim=(1, 2, 3)) * 255
    return [round((float(v) - 16) / 8) for v in levels]


def _opt(root, **kw) -> dict:
    return {"dataroot_gt": str(root), "num_frame": 4, "gt_size": SIZE, "use_hflip": False, "use_rot": False, **kw}


def _pict_types(path) -> list[int]:
    with av.open(str(path)) as container:
        return [int(f.pict_type) for f in container.decode(video=0)]


@pytest.mark.parametrize("ext,open_gop", [(".mp4", 0), (".mkv", 0), (".mov", 1), (".avi", 0)])
def test_seeking_is_frame_accurate_on_h264_with_b_frames(tmp_path, ext, open_gop) -> None:
    path = _write_h264(tmp_path / f"clip{ext}", _numbered(30), keyint=10, open_gop=open_gop)
    assert PictureType.B in _pict_types(path)  # the reordering is real
    index = scan_video(path)
    with VideoReader(path) as reader:
        full = list(reader)
    assert index.num_frames == len(full) == 30 and index.checked
    if ext == ".avi":  # AVI stores decode-order stamps: frames are counted from the start instead
        assert index.pts is None
    else:
        assert index.keyframes.tolist() == [0, 10, 20]
    reader = VideoClipReader()
    order = [29, 0, 10, 11, 9, 20, 21, 28, 1, 19, 5]  # near the end, right after keyframes, backwards
    for i in order:
        np.testing.assert_array_equal(reader.read(index, [i])[0], full[i], err_msg=f"frame {i}")
    for start in (8, 17, 26):  # clips across a keyframe and up to the last frame
        clip = reader.read(index, list(range(start, start + 4)))
        for got, i in zip(clip, range(start, start + 4)):
            np.testing.assert_array_equal(got, full[i], err_msg=f"clip frame {i}")
    reader.close()


def test_clips_stay_inside_one_file_and_one_scene(tmp_path) -> None:
    _write_h264(tmp_path / "a_short.mp4", _numbered(9), keyint=4)
    _write_h264(tmp_path / "b_cut.mp4", _numbered(24, cut=12), keyint=8)
    ds = VideoFileTrainDataset(_opt(tmp_path, interval_list=[1, 2], scene_cut_threshold=0.3))
    assert len(ds) == 9 + 24  # one item per frame
    lengths = {"a_short": 9, "b_cut": 24}
    for seed in range(2):
        seeded = SeededItems(ds, seed)
        for index in range(len(ds)):
            item = seeded[(0, index)]
            numbers, stem = _numbers(item["H"]), item["key"].split("/")[0]
            assert item["H"].shape == (4, 3, SIZE, SIZE) and item["L"].shape == (4, 3, SIZE // 4, SIZE // 4)
            step = numbers[1] - numbers[0]
            assert step in (1, 2) and numbers == list(range(numbers[0], numbers[0] + 4 * step, step)), numbers
            assert 0 <= numbers[0] and numbers[-1] < lengths[stem], (stem, numbers)
            assert int(item["key"].split("/")[1]) == numbers[0]
            if stem == "b_cut":
                assert (numbers[0] < 12) == (numbers[-1] < 12), f"clip {numbers} straddles the cut at 12"


def test_index_cache_is_reused_and_rebuilt_when_the_file_changes(tmp_path) -> None:
    path = _write_h264(tmp_path / "clip.mp4", _numbered(12))
    cache_dir = str(tmp_path / "cache")
    index, built = load_index(path, cache_dir)
    cache = index_cache_path(cache_dir, path)
    assert built and os.path.isfile(cache) and os.listdir(cache_dir) == [os.path.basename(cache)]
    stamp = os.stat(cache).st_mtime_ns
    again, built = load_index(path, cache_dir)
    assert not built and os.stat(cache).st_mtime_ns == stamp and again.pts.tolist() == index.pts.tolist()
    with open(cache) as f:
        assert json.load(f)["size"] == os.path.getsize(path)
    _write_h264(path, _numbered(16))  # new content: size and mtime change
    changed, built = load_index(path, cache_dir)
    assert built and changed.num_frames == 16
    os.utime(path, ns=(os.stat(path).st_atime_ns, os.stat(path).st_mtime_ns + 10**9))  # touched: same size
    _, built = load_index(path, cache_dir)
    assert built
    _, built = load_index(path, cache_dir, scene_diff=True)  # asks for more than the cache holds
    assert built
    # the dataset keeps its cache beside the videos and reuses it on the next start
    VideoFileTrainDataset(_opt(tmp_path))
    ds = VideoFileTrainDataset(_opt(tmp_path))
    assert ds.stats == {"indexed": 0, "cached": 1} and os.path.isdir(tmp_path / ".vrt_index")


def test_bad_files_are_listed_in_one_message_and_strict_makes_it_an_error(tmp_path, caplog) -> None:
    _write_h264(tmp_path / "good.mp4", _numbered(8))
    (tmp_path / "empty.mp4").write_bytes(b"")
    (tmp_path / "notes.mkv").write_text("not a video")
    _write_h264(tmp_path / "short.mov", _numbered(3))
    (tmp_path / "readme.txt").write_text("not listed: no video extension")
    why = {"empty.mp4": "empty file (0 bytes)", "notes.mkv": "cannot open as a video",
           "short.mov": "3 frames, fewer than a clip's 4"}
    with caplog.at_level(logging.WARNING, logger="data.dataset_video_file_train"):
        ds = VideoFileTrainDataset(_opt(tmp_path))
    assert len(ds) == 8 and [ix.path for ix, _ in ds.videos] == [str(tmp_path / "good.mp4")]
    assert len(caplog.records) == 1
    message = caplog.records[0].getMessage()
    assert "skipping 3 of 4" in message and "\n" not in message
    for name, reason in why.items():
        assert f"{tmp_path / name}: {reason}" in message, message
    with pytest.raises(DataCheckError) as err:
        VideoFileTrainDataset(_opt(tmp_path, strict=True))
    for name, reason in why.items():
        assert f"{tmp_path / name}: {reason}" in str(err.value)
    listing = tmp_path / "list.txt"  # a list file: paths relative to its folder, comments and blank lines skipped
    listing.write_text("# my clips\ngood.mp4\n\nmissing.mp4\n")
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="data.dataset_video_file_train"):
        ds = VideoFileTrainDataset(_opt(listing))
    assert [ix.path for ix, _ in ds.videos] == [str(tmp_path / "good.mp4")]
    assert f"{tmp_path / 'missing.mp4'}: cannot read" in caplog.records[0].getMessage()
    os.remove(tmp_path / "good.mp4")
    with pytest.raises(DataCheckError, match="none is usable"):
        VideoFileTrainDataset(_opt(tmp_path))



def test_a_file_that_breaks_mid_run_is_logged_once_and_its_items_come_from_the_next_video(tmp_path, caplog) -> None:
    _write_h264(tmp_path / "a.mp4", _numbered(8))
    _write_h264(tmp_path / "b.mp4", _numbered(8))
    ds = VideoFileTrainDataset(_opt(tmp_path, clips_per_video=2))
    (tmp_path / "b.mp4").write_bytes(b"overwritten during the run")
    with caplog.at_level(logging.WARNING, logger="data.dataset_video_file_train"):
        keys = [SeededItems(ds, 0)[(0, index)]["key"] for index in range(4)]
    assert [k.split("/")[0] for k in keys] == ["a"] * 4
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]  # the INFO summary may pass too
    assert [str(tmp_path / "b.mp4") in r.getMessage() for r in warnings] == [True]


def test_an_item_does_not_depend_on_which_failures_the_process_has_seen(tmp_path) -> None:
    """A worker that already saw a file fail skips it at once; one that has not tries it first, then moves on:
    both give the item the same clip, crop and flips (the retry draws from the item's stream and the attempt)."""
    for name in ("a", "b", "c"):
        _write_h264(tmp_path / f"{name}.mp4", _numbered(12), keyint=4)
    fresh = VideoFileTrainDataset(_opt(tmp_path, gt_size=32, interval_list=[1, 2], random_reverse=True,
                                       use_hflip=True, use_rot=True, clips_per_video=3))
    (tmp_path / "b.mp4").write_bytes(b"overwritten during the run")
    informed = copy.deepcopy(fresh)
    SeededItems(informed, 0)[(0, 3)]  # an item of b: its failure is recorded in this process only
    assert informed._failed == {str(tmp_path / "b.mp4")} and not fresh._failed
    for index in range(9):
        naive = copy.deepcopy(fresh)  # has not seen b fail yet
        a, b = SeededItems(informed, 4)[(1, index)], SeededItems(naive, 4)[(1, index)]
        assert a["key"] == b["key"] and not a["key"].startswith("b/"), (index, a["key"], b["key"])
        assert torch.equal(a["H"], b["H"]) and torch.equal(a["L"], b["L"]), index


def test_a_cropped_read_equals_the_window_of_the_whole_frame(tmp_path) -> None:
    """Only the GT window is converted to RGB (with a margin for the chroma filter): the same bits as cutting the
    window out of the whole frame's conversion, at the frame's edges too, on H.264 with B-frames."""
    rng = np.random.default_rng(0)
    frames = [np.clip(f.astype(np.int16) + rng.integers(-60, 60, f.shape), 0, 255).astype(np.uint8)
              for f in moving_frames(6, 70, 90)]  # noisy colour: the chroma filter's reach shows
    path = _write_h264(tmp_path / "clip.mp4", frames, keyint=3, crf=20)
    index = scan_video(path, check=False)
    reader = VideoClipReader()
    full = reader.read(index, range(6))
    windows = [(0, 0, 70, 90), (0, 0, 17, 23), (53, 67, 17, 23), (1, 3, 31, 31), (30, 41, 9, 5), (7, 0, 1, 90)]
    windows += [(int(rng.integers(0, 70 - h)), int(rng.integers(0, 90 - w)), h, w)
                for h, w in rng.integers(1, 40, (10, 2))]
    for top, left, h, w in windows:
        got = reader.read(index, [5, 1, 2], (top, left, h, w))
        for frame, i in zip(got, [5, 1, 2]):
            assert frame.shape == (h, w, 3) and frame.flags["C_CONTIGUOUS"]
            np.testing.assert_array_equal(frame, full[i][top:top + h, left:left + w], err_msg=f"{(top, left, h, w)}")
    with pytest.raises(VideoFileError, match="window"):
        reader.read(index, [0], (60, 0, 11, 8))
    reader.close()


def _epoch(ds, workers: int, seed: int = 5) -> dict[int, dict]:
    loader, sampler = build_train_loader(ds, {"dataloader_batch_size": 2, "dataloader_num_workers": workers},
                                         rank=0, world_size=1, seed=seed, accum_steps=1, pin_memory=False)
    sampler.set_epoch(1)
    keys = [index for _, index in sampler]
    out = {}
    for position, batch in enumerate(loader):
        for j in range(batch["L"].shape[0]):
            out[keys[2 * position + j]] = {"L": batch["L"][j], "H": batch["H"][j], "key": batch["key"][j]}
    return out


def test_same_items_from_the_same_seed_with_0_and_2_loader_workers(tmp_path) -> None:
    _write_h264(tmp_path / "a.mp4", _numbered(14), keyint=5)
    _write_h264(tmp_path / "b.mkv", _numbered(10), keyint=5)
    ds = define_Dataset({"dataset_type": "VideoFileTrainDataset", **_opt(tmp_path, gt_size=32, use_hflip=True,
                                                                          use_rot=True, random_reverse=True,
                                                                          clips_per_video=5,
                                                                          degradations="realesrgan")})
    assert len(ds) == 10
    ds[0]  # the trainer's self-check reads an item in the main process before the workers fork
    serial, parallel = _epoch(ds, 0), _epoch(ds, 2)
    assert sorted(serial) == sorted(parallel) == list(range(10))
    for index, item in serial.items():
        assert item["key"] == parallel[index]["key"]
        torch.testing.assert_close(item["H"], parallel[index]["H"], rtol=0, atol=0)
        torch.testing.assert_close(item["L"], parallel[index]["L"], rtol=0, atol=0)
    assert len({item["key"] for item in serial.values()}) > 3  # random starts, not one clip
    assert serial[0]["L"].shape == (4, 3, 8, 8)  # degraded on the fly from the item's seeded generator
    # an item depends on (seed, epoch, index) alone: a DDP rank, or a resumed epoch, gets the same clip
    seeded = SeededItems(ds, 5)
    for index in (3, 7):
        torch.testing.assert_close(seeded[(1, index)]["H"], serial[index]["H"], rtol=0, atol=0)
    assert not torch.equal(SeededItems(ds, 6)[(1, 3)]["H"], serial[3]["H"])


def test_paired_lq_and_gt_videos(tmp_path) -> None:
    gt_frames = _numbered(10)
    lq_frames = [img[::4, ::4].copy() for img in gt_frames]  # 16 x 16: a 4 x 4 numbered block
    (tmp_path / "gt").mkdir()
    (tmp_path / "lq").mkdir()
    _write_h264(tmp_path / "gt" / "walk.mp4", gt_frames)
    _write_h264(tmp_path / "lq" / "walk.mp4", lq_frames)
    _write_h264(tmp_path / "gt" / "long.mp4", _numbered(12))
    _write_h264(tmp_path / "lq" / "long.mp4", [img[::4, ::4].copy() for img in _numbered(9)])
    _write_h264(tmp_path / "gt" / "alone.mp4", _numbered(8))
    ds = VideoFileTrainDataset(_opt(tmp_path / "gt", dataroot_lq=str(tmp_path / "lq"), clips_per_video=6))
    assert [os.path.basename(ix.path) for ix, _ in ds.videos] == ["walk.mp4"]  # long: 9 vs 12 frames; alone: no LQ
    lq_full, _ = read_video(str(tmp_path / "lq" / "walk.mp4"))
    for index in range(len(ds)):
        item = SeededItems(ds, 1)[(0, index)]
        numbers = _numbers(item["H"])
        assert item["L"].shape == (4, 3, SIZE // 4, SIZE // 4)
        torch.testing.assert_close(item["L"], lq_full[numbers], rtol=0, atol=0)  # the LQ video's own frames
    with pytest.raises(DataCheckError) as err:
        VideoFileTrainDataset(_opt(tmp_path / "gt", dataroot_lq=str(tmp_path / "lq"), strict=True))
    assert "long.mp4: its LQ" in str(err.value) and "has 9 frames, the GT 12" in str(err.value)
    assert f"{tmp_path / 'gt' / 'alone.mp4'}: its LQ {tmp_path / 'lq' / 'alone.mp4'}: cannot read" in str(err.value)


def test_synthesize_if_missing_writes_the_videos_once(tmp_path) -> None:
    root = tmp_path / "data" / "train_videos"
    spec = {"num_videos": 2, "num_frames": 10, "size": [48, 48], "seed": 3}
    opt = _opt(root, gt_size=32, synthesize_if_missing={**spec, "root": str(root)})
    ds = VideoFileTrainDataset(opt)
    names = sorted(os.listdir(root))
    assert names == [".vrt_index", "synthetic_000.mp4", "synthetic_001.mp4"] and len(ds) == 20
    assert os.listdir(tmp_path / "data") == ["train_videos"]  # the temporary folder was renamed, nothing left
    assert PictureType.B in _pict_types(root / "synthetic_000.mp4")
    stamps = [os.stat(root / n).st_mtime_ns for n in names[1:]]
    again = VideoFileTrainDataset(opt)
    assert [os.stat(root / n).st_mtime_ns for n in names[1:]] == stamps and again.stats["cached"] == 2
    assert not synthesize_videos(str(root), {**spec, "num_videos": 5})  # present: kept as it is
    clip, _ = read_video(str(root / "synthetic_001.mp4"))
    assert clip.shape == (10, 3, 48, 48) and float(clip.std()) > 0.05  # textured content, not a blank
    with pytest.raises(OptionError, match="synthesize_if_missing.*size must be"):
        VideoFileTrainDataset(_opt(tmp_path / "other", synthesize_if_missing={"root": str(tmp_path / "other"),
                                                                              "size": [47, 48]}))
    with pytest.raises(OptionError, match="synthesize_if_missing.*needs 'root'"):
        VideoFileTrainDataset(_opt(tmp_path / "other", synthesize_if_missing={"num_videos": 1}))


def test_two_processes_write_the_videos_once_and_train_on_their_shards(tmp_path) -> None:
    data = tmp_path / "videos"
    train = {"name": "train_dataset", "dataset_type": "VideoFileTrainDataset", "dataroot_gt": str(data),
             "num_frame": 2, "gt_size": 32, "clips_per_video": 4, "dataloader_batch_size": 2,
             "dataloader_num_workers": 2,
             "synthesize_if_missing": {"root": str(data), "num_videos": 2, "num_frames": 8, "size": [48, 48]}}
    base = {**copy.deepcopy(TINY_OPT), "datasets": {"train": train}}
    opt = write_opt(tmp_path, base=base, train={"total_iter": 2, "checkpoint_save": 2})
    report = tmp_path / "report"
    report.mkdir()
    assert_ok(torchrun(2, ["--opt", opt], base_env(str(report), TEST_LOG_ITEMS="1"), str(tmp_path)))
    assert sorted(os.listdir(data)) == ["synthetic_000.mp4", "synthetic_001.mp4"]  # the index is beside the run
    index_dir = tmp_path / "experiments" / TINY_OPT["task"] / "video_index"
    assert sorted(n.split(".")[0] for n in os.listdir(index_dir)) == ["synthetic_000", "synthetic_001"]
    assert os.listdir(tmp_path).count("videos") == 1 and not [n for n in os.listdir(tmp_path) if ".tmp" in n]
    ranks = reports(str(report))
    assert [r["rc"] for r in ranks] == [0, 0]
    assert any(w.startswith(str(index_dir)) for w in ranks[0]["writes"])  # rank 0 indexed, rank 1 read its cache
    assert not [w for w in ranks[1]["writes"] if w.startswith(str(data))], "rank 1 wrote into the data folder"
    assert not [w for w in ranks[1]["writes"] if w.startswith(str(index_dir))], "rank 1 rebuilt rank 0's index"
    # the two ranks trained on their shards of the epoch: together, the items one process makes for those keys
    logged = []
    for name in os.listdir(report):
        if name.startswith("items-"):
            with open(report / name) as f:
                logged += [item for line in f for item in json.loads(line)["items"]]
    ds = VideoFileTrainDataset({k: v for k, v in train.items() if not k.startswith("dataloader")})
    sampler = ResumableSampler(ds, 1, 0, shuffle=True, seed=0)
    expected = []
    for key in list(sampler)[:4]:  # 2 steps of the global batch 2
        item = SeededItems(ds, 0)[key]
        expected.append([item["key"], float(item["L"].double().sum()), float(item["H"].double().sum())])
    assert len(logged) == 4
    for got, want in zip(sorted(logged), sorted(expected)):
        assert got[0] == want[0] and got[1:] == pytest.approx(want[1:], rel=1e-9)
