"""Test datasets (whole clips, Vimeo-90K-T, VFI sets) and the build-time data checks of all datasets."""

from __future__ import annotations

import copy
import os

import cv2
import lmdb
import numpy as np
import pytest
import torch

from data.dataset_video_test import (
    VFI_DAVIS,
    VFI_UCF101,
    SingleVideoRecurrentTestDataset,
    VFI_Vid4,
    VideoRecurrentTestDataset,
    VideoTestVimeo90KDataset,
)
from data.dataset_video_train import VideoRecurrentTrainDataset
from data.select_dataset import define_Dataset
from tests.support.datasets import NFRAMES, item, lmdb_opt, make_reds, make_vimeo
from utils.utils_option import OptionError
from utils.utils_video import DataCheckError, ImageDecodeError


def make_clips(root: str, names=("calendar", "city"), frames: int = 3, hw=(8, 10)) -> None:
    for c, name in enumerate(names):
        for sub, scale in (("lq", 1), ("gt", 2)):
            os.makedirs(os.path.join(root, sub, name))
            for t in range(frames):
                img = np.full((hw[0] * scale, hw[1] * scale, 3), 30 * c + 10 * t, np.uint8)
                img[..., 2] = 255  # red in BGR
                cv2.imwrite(os.path.join(root, sub, name, f"{t:08d}.png"), img)


def test_paired_clips_cache_and_paths(tmp_path):
    make_clips(str(tmp_path))
    opt = {"dataset_type": "VideoRecurrentTestDataset", "dataroot_gt": str(tmp_path / "gt"),
           "dataroot_lq": str(tmp_path / "lq"), "cache_data": True, "io_backend": {"type": "disk"}, "num_frame": -1}
    frozen = copy.deepcopy(opt)
    ds = define_Dataset(opt)
    assert opt == frozen and len(ds) == 2
    out = ds[1]
    assert out["folder"] == "city" and out["L"].shape == (3, 3, 8, 10) and out["H"].shape == (3, 3, 16, 20)
    assert torch.all(out["L"][:, 0] == 1) and torch.all(out["H"][:, 0] == 1)  # RGB order
    assert isinstance(out["lq_path"], list) and all(isinstance(p, str) and os.path.isfile(p) for p in out["lq_path"])
    assert [os.path.basename(p) for p in out["gt_path"]] == ["00000000.png", "00000001.png", "00000002.png"]
    lazy = VideoRecurrentTestDataset({**opt, "cache_data": False})[1]
    assert torch.equal(lazy["L"], out["L"]) and lazy["lq_path"] == out["lq_path"]
    single_opt = {**opt, "dataset_type": "SingleVideoRecurrentTestDataset", "dataroot_gt": None}
    single = define_Dataset(single_opt)[0]
    assert set(single) == {"L", "folder", "lq_path"} and single["L"].shape == (3, 3, 8, 10)
    with pytest.raises(OptionError, match="reads LQ only"):  # GT given to the LQ-only set is refused, not ignored
        SingleVideoRecurrentTestDataset(opt)


def test_denoising_noise_local_and_reproducible(tmp_path):
    make_clips(str(tmp_path), frames=2, hw=(32, 32))
    opt = {"dataroot_gt": str(tmp_path / "gt"), "dataroot_lq": str(tmp_path / "gt"), "sigma": 30,
           "cache_data": False, "num_frame": -1}
    state = torch.get_rng_state()
    a = VideoRecurrentTestDataset(opt)[0]
    assert torch.equal(torch.get_rng_state(), state)  # the global RNG is never reseeded nor advanced
    b = VideoRecurrentTestDataset({**opt, "cache_data": True})[0]
    assert a["L"].shape == (2, 4, 64, 64) and torch.equal(a["L"], b["L"])
    assert torch.all(a["L"][:, 3] == torch.tensor(30 / 255))
    assert abs((a["L"][:, :3] - a["H"]).std().item() - 30 / 255) < 0.05 * 30 / 255
    torch.manual_seed(0)  # the official script's noise: torch.manual_seed(0) then torch.normal
    ref = torch.normal(mean=0, std=(torch.ones((1, 1, 1, 1)) * 30 / 255).expand_as(a["H"]))
    assert torch.allclose(a["L"][:, :3], a["H"] + ref)
    c = VideoRecurrentTestDataset({**opt, "noise_seed_per_clip": True})
    assert torch.equal(c[0]["L"], a["L"]) and not torch.equal(c[1]["L"][:, :3] - c[1]["H"], a["L"][:, :3] - a["H"])
    single = SingleVideoRecurrentTestDataset({**opt, "dataroot_lq": str(tmp_path / "gt"), "dataroot_gt": None})[0]
    assert single["L"].shape == (2, 4, 64, 64) and torch.all(single["L"][:, 3] == torch.tensor(30 / 255))


def test_vimeo_test_pad_and_mirror(tmp_path):
    opt = make_vimeo(str(tmp_path))
    vopt = {"dataroot_gt": opt["dataroot_gt"], "dataroot_lq": opt["dataroot_lq"], "meta_info_file":
            opt["meta_info_file"], "num_frame": 7, "cache_data": False}
    out = VideoTestVimeo90KDataset({**vopt, "pad_sequence": True})[1]
    assert out["L"].shape == (8, 3, 4, 4) and out["H"].shape == (1, 3, 16, 16) and out["folder"] == "00001/0002"
    assert out["gt_path"][0].endswith(os.path.join("00001", "0002", "im4.png")) and len(out["lq_path"]) == 7
    mir = VideoTestVimeo90KDataset({**vopt, "num_frame": -1, "mirror_sequence": True})[0]
    assert mir["L"].shape[0] == 14 and torch.equal(mir["L"][7:], mir["L"][:7].flip(0))
    vfi = VideoTestVimeo90KDataset({**vopt, "dataroot_lq": opt["dataroot_gt"], "temporal_scale": 2})[0]
    assert [round(v * 255) for v in vfi["L"][:, 0, 1, 1].tolist()] == [20, 60, 100, 140]


def test_vfi_test_sets_from_option_dicts(tmp_path):
    davis = tmp_path / "davis"
    for t in range(9):
        (davis / "bear").mkdir(parents=True, exist_ok=True)
        cv2.imwrite(str(davis / "bear" / f"{t:05d}.png"), np.full((500, 860, 3), 10 * t, np.uint8))
    ds = define_Dataset({"dataset_type": "VFI_DAVIS", "dataroot_gt": str(davis)})
    assert isinstance(ds, VFI_DAVIS) and len(ds) == 2
    out = ds[1]  # window starting at frame 2: inputs 2, 4, 6, 8 -> target 5
    assert out["L"].shape == (4, 3, 480, 840) and out["H"].shape == (1, 3, 480, 840)
    assert [round(v * 255) for v in out["L"][:, 0, 0, 0].tolist()] == [20, 40, 60, 80]
    assert round(out["H"][0, 0, 0, 0].item() * 255) == 50
    assert len(VFI_DAVIS(data_root=str(davis))) == 2  # KAIR's keyword still works
    ucf = tmp_path / "ucf"
    (ucf / "v1").mkdir(parents=True)
    for name in ("frame0", "frame1", "frame2", "frame3", "framet"):
        cv2.imwrite(str(ucf / "v1" / f"{name}.png"), np.zeros((256, 256, 3), np.uint8))
    u = VFI_UCF101({"dataroot_gt": str(ucf)})[0]
    assert u["L"].shape == (4, 3, 224, 224) and u["folder"] == "v1"
    vid4 = tmp_path / "vid4"
    (vid4 / "walk").mkdir(parents=True)
    for t in range(5):
        cv2.imwrite(str(vid4 / "walk" / f"{t:08d}.png"), np.full((8, 8, 3), 10 * t, np.uint8))
    v = VFI_Vid4({"dataroot_gt": str(vid4)})
    targets = [round(v[i]["H"][0, 0, 0, 0].item() * 255) for i in range(len(v))]
    assert targets == [10, 30]  # every odd frame is interpolated
    assert [round(x * 255) for x in v[0]["L"][:, 0, 0, 0].tolist()] == [0, 0, 20, 40]


def test_missing_frame_is_named(tmp_path):
    opt = make_reds(str(tmp_path))
    os.remove(os.path.join(str(tmp_path), "gt", "001", "00000005.png"))
    os.remove(os.path.join(str(tmp_path), "gt", "001", "00000006.png"))
    with pytest.raises(DataCheckError, match=r"2 problem.*001/00000005\.png"):
        VideoRecurrentTrainDataset(opt)
    make_clips(str(tmp_path / "t"))
    os.remove(str(tmp_path / "t" / "lq" / "city" / "00000001.png"))
    with pytest.raises(DataCheckError, match="city: 2 LQ frames, 3 GT frames"):
        VideoRecurrentTestDataset({"dataroot_gt": str(tmp_path / "t" / "gt"),
                                   "dataroot_lq": str(tmp_path / "t" / "lq")})


def test_missing_lmdb_key_is_named(tmp_path):
    root = str(tmp_path)
    opt = lmdb_opt(make_reds(root, lmdb_too=True), root)
    env = lmdb.open(opt["dataroot_lq"], map_size=1 << 26)
    with env.begin(write=True) as txn:
        txn.delete(b"001/00000003")
    env.close()
    with pytest.raises(DataCheckError, match=r"lq\.lmdb:001/00000003"):
        VideoRecurrentTrainDataset(opt)
    with pytest.raises(DataCheckError, match="does not exist"):
        VideoRecurrentTrainDataset({**opt, "dataroot_gt": os.path.join(root, "nope.lmdb")})


def test_unreadable_image_is_named(tmp_path):
    root = str(tmp_path)
    opt = make_reds(root)
    bad_first = os.path.join(root, "lq", "001", "00000000.png")
    with open(bad_first, "wb") as f:
        f.write(b"not a png")
    with pytest.raises(DataCheckError, match=r"cannot decode image .*001/00000000\.png"):
        VideoRecurrentTrainDataset(opt)
    opt = make_reds(root)  # rewrite good frames, then corrupt one the build-time sample does not decode
    bad = os.path.join(root, "gt", "001", "00000002.png")
    with open(bad, "wb") as f:
        f.write(b"")
    ds = VideoRecurrentTrainDataset({**opt, "random_reverse": False})
    with pytest.raises(ImageDecodeError, match=r"001/00000002\.png"):
        item(ds, 0)
    cv2.imwrite(os.path.join(root, "gt", "001", "00000000.png"), np.zeros((4, 4, 3), np.uint8))
    with pytest.raises(DataCheckError, match="size mismatch"):
        VideoRecurrentTrainDataset(opt)
    assert NFRAMES == 8


def test_video_file_dataset_through_the_registry(tmp_path):
    from data.dataset_video_file import write_video
    from tests.support.video_helpers import FPS

    gt = torch.rand(3, 3, 16, 20, generator=torch.Generator().manual_seed(0))
    write_video(str(tmp_path / "gt" / "clip.mkv"), gt, fps=FPS)
    write_video(str(tmp_path / "lq" / "clip.mkv"), gt[..., ::2, ::2], fps=FPS)
    (tmp_path / "lq" / "notes.mp4").write_text("not a video")
    opt = {"dataset_type": "VideoFileTestDataset", "dataroot_gt": str(tmp_path / "gt"),
           "dataroot_lq": str(tmp_path / "lq")}
    with pytest.raises(ValueError, match=r"notes\.mp4: cannot open as a video"):  # checked when built
        define_Dataset({**opt, "dataroot_gt": None})
    os.remove(tmp_path / "lq" / "notes.mp4")
    out = define_Dataset(opt)[0]
    assert out["L"].shape == (3, 3, 8, 10) and out["fps"] == FPS and not out["has_audio"]
    torch.testing.assert_close(out["H"], gt.mul(255).round().div(255), rtol=0, atol=1e-7)  # lossless FFV1
