"""Training datasets on tiny generated REDS / Vimeo-style data (disk and KAIR-format LMDB)."""

from __future__ import annotations

import copy
import os
import random

import cv2
import numpy as np
import pytest
import torch

from data.dataset_video_train import (
    VideoRecurrentTrainDataset,
    VideoRecurrentTrainNonblindDenoisingDataset,
    VideoRecurrentTrainVimeoDataset,
    VideoRecurrentTrainVimeoVFIDataset,
    vimeo_neighbors,
)
from data.select_dataset import DATASETS, define_Dataset
from tests.support.datasets import (
    LQ_HW,
    NFRAMES,
    SCALE,
    item,
    lmdb_opt,
    make_reds,
    make_vimeo,
    upsample,
)
from utils import utils_video
from utils.utils_video import DataCheckError


@pytest.fixture(scope="module")
def reds(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("reds"))
    return root, make_reds(root, lmdb_too=True)


def test_registry_names_and_unknown():
    for name in ("videorecurrenttraindataset", "videorecurrenttrainnonblinddenoisingdataset",
                 "videorecurrenttrainvimeodataset", "videorecurrenttrainvimeovfidataset", "videorecurrenttestdataset",
                 "singlevideorecurrenttestdataset", "videotestvimeo90kdataset", "vfi_davis", "vfi_ucf101", "vfi_vid4",
                 "syntheticvideotraindataset", "syntheticvideotestdataset"):
        assert name in DATASETS
    with pytest.raises(KeyError, match="videorecurrenttraindataset"):
        define_Dataset({"dataset_type": "NoSuchDataset"})


def test_shapes_disk_equals_lmdb_and_opt_unchanged(reds):
    root, opt = reds
    frozen = copy.deepcopy(opt)
    disk = define_Dataset(opt)
    lm = define_Dataset(lmdb_opt(opt, root))
    assert opt == frozen
    assert len(disk) == len(lm) == NFRAMES  # only clip 001: 000 and 011 are REDS4
    for i in range(len(disk)):
        a, b = item(disk, i, seed=i), item(lm, i, seed=i)
        assert a["L"].shape == (4, 3, 8, 8) and a["H"].shape == (4, 3, 32, 32)
        assert a["L"].dtype == torch.float32 and a["key"] == b["key"]
        assert torch.equal(a["L"], b["L"]) and torch.equal(a["H"], b["H"])
    assert opt == frozen  # nothing popped from io_backend after reading


def test_crop_and_augmentation_shared(reds):
    _, opt = reds
    ds = VideoRecurrentTrainDataset({**opt, "random_reverse": False})
    flips_seen = set()
    for seed in range(12):
        out = item(ds, 0, seed)
        lq, gt = out["L"], out["H"]
        # GT is nearest upsampling of LQ, pixel for pixel, after the same crop and flips
        assert torch.equal(gt, lq.repeat_interleave(SCALE, dim=2).repeat_interleave(SCALE, dim=3))
        # every frame got the same crop and flips: frame t = frame 0 + 10 t / 255 everywhere
        for t in range(1, 4):
            assert torch.allclose(lq[t] - lq[0], torch.full_like(lq[0], 10 * t / 255), atol=1e-6)
        flips_seen.add(tuple(lq[0, 0, 0, :2].tolist()))
    assert len(flips_seen) > 1  # the crop / flips do vary


def test_augment_order_and_rng_draws():
    img = np.arange(2 * 3 * 1, dtype=np.float32).reshape(2, 3, 1)
    random.seed(3)
    draws = [random.random() < 0.5 for _ in range(3)]
    random.seed(3)
    (out,) = utils_video.augment([img], True, True)
    ref = img
    if draws[0]:
        ref = ref[:, ::-1]
    if draws[1]:
        ref = ref[::-1]
    if draws[2]:
        ref = ref.transpose(1, 0, 2)
    assert np.array_equal(out, ref)


def test_rgb_order(tmp_path):
    root = str(tmp_path)
    opt = make_reds(root, clips=("005",))
    red = np.zeros((LQ_HW[0], LQ_HW[1], 3), np.uint8)
    red[..., 2] = 255  # BGR red
    for t in range(NFRAMES):
        cv2.imwrite(os.path.join(root, "lq", "005", f"{t:08d}.png"), red)
        cv2.imwrite(os.path.join(root, "gt", "005", f"{t:08d}.png"), upsample(red))
    out = item(VideoRecurrentTrainDataset(opt), 0)
    assert torch.all(out["L"][:, 0] == 1) and torch.all(out["L"][:, 1:] == 0) and torch.all(out["H"][:, 0] == 1)


def test_val_partition_held_out_whatever_the_name(reds):
    _, opt = reds
    train = VideoRecurrentTrainDataset({**opt, "name": "train_dataset"})
    seen = {item(train, i, i)["key"].split("/")[0] for i in range(len(train))}
    assert seen == {"001"}
    val = VideoRecurrentTrainDataset({**opt, "test_mode": True})
    assert {val.clips[c] for c in val._clip} == {"000", "011"} and len(val) == 2 * NFRAMES
    everything = VideoRecurrentTrainDataset({**opt, "val_partition": None})
    assert len(everything) == 3 * NFRAMES
    with pytest.raises(ValueError, match="val_partition"):
        VideoRecurrentTrainDataset({**opt, "val_partition": "REDS5"})


def test_sampling_stays_inside_clip(reds):
    _, opt = reds
    ds = VideoRecurrentTrainDataset({**opt, "random_reverse": False, "interval_list": [2]})
    random.seed(0)
    for i in range(len(ds)):
        frames = ds._neighbors(i)
        assert len(frames) == 4 and frames[1] - frames[0] == 2 and 0 <= min(frames) and max(frames) < NFRAMES
    with pytest.raises(DataCheckError, match="shorter"):
        VideoRecurrentTrainDataset({**opt, "num_frame": 5, "interval_list": [2]})
    with pytest.raises(ValueError, match="num_frame"):
        VideoRecurrentTrainDataset({**opt, "num_frame": -1})


def test_denoising_sigma_map_and_strength(reds):
    root, opt = reds
    gt_lmdb = os.path.join(root, "gt.lmdb")
    dopt = {**opt, "dataset_type": "VideoRecurrentTrainNonblindDenoisingDataset", "dataroot_gt": gt_lmdb,
            "dataroot_lq": gt_lmdb, "io_backend": {"type": "lmdb"}, "gt_size": 32, "scale": 1, "sigma_min": 25,
            "sigma_max": 25}
    ds = define_Dataset(dopt)
    assert isinstance(ds, VideoRecurrentTrainNonblindDenoisingDataset)
    out = item(ds, 0)
    assert out["L"].shape == (4, 4, 32, 32) and out["H"].shape == (4, 3, 32, 32)
    assert torch.all(out["L"][:, 3] == torch.tensor(25 / 255))
    noise = out["L"][:, :3] - out["H"]
    assert abs(noise.std().item() - 25 / 255) < 0.1 * 25 / 255 and abs(noise.mean().item()) < 0.01
    assert (out["L"][:, :3] > 1).any() or (out["L"][:, :3] < 0).any()  # not clipped
    assert len(utils_video._ENVS.envs) == 1  # one environment for GT given twice
    ds2 = VideoRecurrentTrainNonblindDenoisingDataset({**dopt, "sigma_min": 0, "sigma_max": 50})
    sigmas = {round(item(ds2, 0, s)["L"][0, 3, 0, 0].item() * 255, 3) for s in range(5)}
    assert len(sigmas) == 5 and all(0 <= s <= 50 for s in sigmas)
    for s in range(3):  # one sigma per clip, shared by all frames
        assert torch.unique(item(ds2, 0, s)["L"][:, 3]).numel() == 1


def test_vimeo_all_frames_pad_mirror_reverse(tmp_path):
    opt = make_vimeo(str(tmp_path), lmdb_too=True)
    ds = VideoRecurrentTrainVimeoDataset(opt)
    assert ds.neighbor_list == [1, 2, 3, 4, 5, 6, 7]
    orders = set()
    for s in range(8):
        out = item(ds, 0, s)
        assert out["L"].shape == (7, 3, 2, 2) and out["H"].shape == (7, 3, 8, 8) and out["key"] == "00001/0001"
        orders.add(round(out["L"][0, 1, 1, 1].item() * 255))
    assert orders == {20, 140} and ds.neighbor_list == [1, 2, 3, 4, 5, 6, 7]  # reversed sometimes, list untouched
    pad = item(VideoRecurrentTrainVimeoDataset({**opt, "pad_sequence": True, "random_reverse": False}), 1)
    assert pad["L"].shape[0] == 8 and torch.equal(pad["L"][7], pad["L"][6]) and torch.equal(pad["H"][7], pad["H"][6])
    mir = item(VideoRecurrentTrainVimeoDataset({**opt, "mirror_sequence": True}), 1)
    assert mir["H"].shape[0] == 14 and torch.equal(mir["H"][7:], mir["H"][:7].flip(0))
    lm = VideoRecurrentTrainVimeoDataset(lmdb_opt(opt, str(tmp_path)))
    assert torch.equal(item(lm, 1, 4)["H"], item(ds, 1, 4)["H"])
    assert vimeo_neighbors(7, 2) == [1, 3, 5, 7] and vimeo_neighbors(3) == [3, 4, 5]


def test_vfi_quadruplet_to_middle(tmp_path):
    opt = make_vimeo(str(tmp_path), lmdb_too=True)
    gt_lmdb = os.path.join(str(tmp_path), "gt.lmdb")
    vopt = {**opt, "dataset_type": "VideoRecurrentTrainVimeoVFIDataset", "dataroot_gt": gt_lmdb,
            "dataroot_lq": gt_lmdb, "io_backend": {"type": "lmdb"}, "num_frame": 7, "temporal_scale": 2,
            "gt_size": 8, "scale": 1, "random_reverse": False}
    out = item(define_Dataset(vopt), 0)
    assert out["L"].shape == (4, 3, 8, 8) and out["H"].shape == (1, 3, 8, 8)
    centre = [round(v * 255) for v in out["L"][:, 0, 4, 4].tolist()]
    assert centre == [20, 60, 100, 140] and round(out["H"][0, 0, 4, 4].item() * 255) == 80
    jit = VideoRecurrentTrainVimeoVFIDataset({**vopt, "color_jitter": True})
    assert item(jit, 0)["L"].shape == (4, 3, 8, 8)
