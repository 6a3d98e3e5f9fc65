"""Synthetic procedural video datasets: shapes, determinism, degradations, motion, option handling."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

from data.dataset_synthetic import (
    VFI_FRAMES,
    SyntheticVideoTestDataset,
    SyntheticVideoTrainDataset,
    bicubic_downsample,
    render_blurry_clip,
    render_clip,
)

TRAIN = {"num_frame": 3, "gt_size": 32, "num_clips": 8, "seed": 5, "use_hflip": True, "use_rot": True}
TEST = {"num_clips": 2, "num_frame": 3, "lq_size": [12, 16], "seed": 9}
# task -> (L channels, L frames, H frames, scale)
EXPECT = {"sr": (3, 3, 3, 4), "deblur": (3, 3, 3, 1), "denoise": (4, 3, 3, 1), "vfi": (3, 4, 1, 1)}


def _rng(seed: int, index: int) -> np.random.Generator:
    return np.random.Generator(np.random.PCG64([seed, index]))


@pytest.mark.parametrize("task", sorted(EXPECT))
def test_train_item_shapes_dtypes_ranges(task):
    c, tl, th, scale = EXPECT[task]
    ds = SyntheticVideoTrainDataset({**TRAIN, "task": task})
    assert len(ds) == 8
    item = ds[3]
    assert set(item) == {"L", "H", "key"} and isinstance(item["key"], str)
    assert item["L"].shape == (tl, c, 32 // scale, 32 // scale)
    assert item["H"].shape == (th, 3, 32, 32)
    assert item["L"].dtype == item["H"].dtype == torch.float32
    assert 0 <= item["H"].min() and item["H"].max() <= 1
    if task != "denoise":
        assert 0 <= item["L"].min() and item["L"].max() <= 1


@pytest.mark.parametrize("task", sorted(EXPECT))
def test_test_item_shapes_and_names(task):
    c, tl, th, scale = EXPECT[task]
    ds = SyntheticVideoTestDataset({**TEST, "task": task})
    assert len(ds) == 2
    item = ds[1]
    assert item["L"].shape == (tl, c, 12, 16)
    assert item["H"].shape == (th, 3, 12 * scale, 16 * scale)
    assert item["folder"] == "clip_001"
    expected = ["clip_001/00000003.png"] if task == "vfi" else [f"clip_001/{i:08d}.png" for i in range(3)]
    assert item["gt_path"] == expected and item["lq_path"] == expected
    assert 0 <= item["H"].min() and item["H"].max() <= 1


def test_defaults():
    item = SyntheticVideoTestDataset({"task": "sr"})[0]
    assert item["L"].shape == (6, 3, 64, 64) and item["H"].shape == (6, 3, 256, 256)
    ds = SyntheticVideoTrainDataset({})
    assert (ds.task, ds.scale, ds.num_frame, ds.gt_size, len(ds), ds.seed) == ("sr", 4, 6, 256, 1000, 0)


@pytest.mark.parametrize("task", sorted(EXPECT))
def test_deterministic_by_seed_and_index(task):
    a = SyntheticVideoTrainDataset({**TRAIN, "task": task})
    b = SyntheticVideoTrainDataset({**TRAIN, "task": task})
    x, y = a[2], b[2]
    assert torch.equal(x["L"], y["L"]) and torch.equal(x["H"], y["H"]) and x["key"] == y["key"]
    assert not torch.equal(a[3]["H"], x["H"])
    other_seed = SyntheticVideoTrainDataset({**TRAIN, "task": task, "seed": 6})[2]
    assert not torch.equal(other_seed["H"], x["H"])
    t1, t2 = SyntheticVideoTestDataset({**TEST, "task": task}), SyntheticVideoTestDataset({**TEST, "task": task})
    assert torch.equal(t1[0]["L"], t2[0]["L"]) and torch.equal(t1[0]["H"], t2[0]["H"])
    assert not torch.equal(t1[0]["H"], t1[1]["H"])


def test_render_clip_is_a_pure_function_of_the_generator():
    clip = render_clip(_rng(0, 0), 4, 24, 40)
    assert clip.shape == (4, 24, 40, 3) and clip.dtype == np.float32
    assert 0 <= clip.min() and clip.max() <= 1
    np.testing.assert_array_equal(clip * 255, np.round(clip * 255))  # 8-bit levels
    np.testing.assert_array_equal(clip, render_clip(_rng(0, 0), 4, 24, 40))
    assert clip.std() > 0.05  # not a flat image


def test_sr_lq_is_documented_bicubic_downsampling_of_gt():
    ds = SyntheticVideoTrainDataset({**TRAIN, "task": "sr"})
    for i in range(3):
        item = ds[i]
        assert torch.equal(item["L"], bicubic_downsample(item["H"], 4))
        plain = F.interpolate(item["H"], size=(8, 8), mode="bicubic", antialias=True, align_corners=False)
        assert (item["L"] - plain.clamp(0, 1)).abs().max() <= 0.5 / 255 + 1e-6
        assert torch.equal(item["L"] * 255, torch.round(item["L"] * 255))
    test_item = SyntheticVideoTestDataset({**TEST, "task": "sr"})[0]
    assert torch.equal(test_item["L"], bicubic_downsample(test_item["H"], 4))


def test_sr_bicubic_upsampling_is_a_meaningful_but_imperfect_baseline():
    item = SyntheticVideoTestDataset({"task": "sr", "num_frame": 2, "lq_size": [32, 32]})[0]
    up = F.interpolate(item["L"], scale_factor=4, mode="bicubic", align_corners=False).clamp(0, 1)
    psnr = 10 * torch.log10(1 / F.mse_loss(up, item["H"]))
    assert 18 < psnr < 40, psnr  # detail is lost by downsampling, yet LQ predicts GT well


def test_augmentation_is_a_shared_dihedral_transform():
    plain = SyntheticVideoTrainDataset({**TRAIN, "task": "sr", "use_hflip": False, "use_rot": False})
    aug = SyntheticVideoTrainDataset({**TRAIN, "task": "sr"})
    changed = 0
    for i in range(8):
        h0, h1 = plain[i]["H"], aug[i]["H"]
        candidates = [h0, h0.flip(-1), h0.flip(-2), h0.flip(-1).flip(-2)]
        candidates += [c.transpose(-1, -2) for c in candidates]
        match = [k for k, c in enumerate(candidates) if torch.equal(c, h1)]
        assert match, f"item {i}: augmented GT is no flip/transpose of the plain GT"
        changed += match[0] != 0
        assert torch.equal(aug[i]["L"], bicubic_downsample(h1, 4))
    assert changed > 0


def test_denoise_sigma_map_and_noise_level():
    ds = SyntheticVideoTrainDataset({**TRAIN, "task": "denoise", "gt_size": 64, "sigma_min": 10, "sigma_max": 50})
    sigmas = []
    for i in range(4):
        item = ds[i]
        sigma_map = item["L"][:, 3]
        sigma = float(sigma_map[0, 0, 0])
        assert torch.all(sigma_map == sigma)
        assert 10 / 255 <= sigma <= 50 / 255
        noise = item["L"][:, :3] - item["H"]
        assert abs(float(noise.std()) / sigma - 1) < 0.05
        assert abs(float(noise.mean())) < 0.1 * sigma
        sigmas.append(sigma)
    assert len(set(sigmas)) == 4  # one sigma per clip
    item = SyntheticVideoTestDataset({**TEST, "task": "denoise", "sigma": 50, "lq_size": [64, 64]})[0]
    assert torch.all(item["L"][:, 3] == np.float32(50 / 255))
    assert abs(float((item["L"][:, :3] - item["H"]).std()) * 255 / 50 - 1) < 0.05
    assert item["L"][:, :3].min() < 0 or item["L"][:, :3].max() > 1  # unclipped


def test_vfi_inputs_are_even_frames_and_target_is_middle_frame():
    ds = SyntheticVideoTestDataset({**TEST, "task": "vfi", "seed": 3})
    item = ds[1]
    clip = torch.from_numpy(render_clip(_rng(3, 1), VFI_FRAMES, 12, 16)).permute(0, 3, 1, 2)
    assert torch.equal(item["L"], clip[[0, 2, 4, 6]])
    assert torch.equal(item["H"], clip[3:4])
    train = SyntheticVideoTrainDataset({**TRAIN, "task": "vfi", "use_hflip": False, "use_rot": False})[4]
    clip = torch.from_numpy(render_clip(_rng(5, 4), VFI_FRAMES, 32, 32)).permute(0, 3, 1, 2)
    assert torch.equal(train["L"], clip[0::2]) and torch.equal(train["H"], clip[3:4])


def test_deblur_pairs_share_the_scene_and_lq_is_blurrier():
    sharp, blurry = render_blurry_clip(_rng(1, 0), 3, 48, 48)
    assert sharp.shape == blurry.shape == (3, 48, 48, 3)
    item = SyntheticVideoTrainDataset({**TRAIN, "task": "deblur", "use_hflip": False, "use_rot": False})[0]
    lq, gt = item["L"], item["H"]
    assert not torch.equal(lq, gt)
    assert (lq - gt).abs().mean() < 0.1  # same content

    def grad_energy(x):
        return float((x[..., 1:, :] - x[..., :-1, :]).abs().mean() + (x[..., 1:] - x[..., :-1]).abs().mean())

    assert grad_energy(lq) < grad_energy(gt)


def test_motion_exists_but_is_small():
    ds = SyntheticVideoTrainDataset({"task": "sr", "num_frame": 4, "gt_size": 64, "num_clips": 4, "seed": 0})
    between = float((ds[0]["H"][0] - ds[1]["H"][0]).abs().mean())
    for i in range(4):
        gt = ds[i]["H"]
        diffs = (gt[1:] - gt[:-1]).abs().mean(dim=(1, 2, 3))
        assert torch.all(diffs > 1e-3), f"clip {i}: a frame repeats ({diffs})"
        assert torch.all(diffs < 0.5 * between) and torch.all(diffs < 0.1), f"clip {i}: motion too large ({diffs})"


def test_opt_is_not_mutated():
    for cls, opt in ((SyntheticVideoTrainDataset, {**TRAIN, "task": "denoise", "sigma_min": 5}),
                     (SyntheticVideoTestDataset, {**TEST, "task": "sr", "scale": 4})):
        frozen = copy.deepcopy(opt)
        ds = cls(opt)
        ds[0]
        assert opt == frozen


@pytest.mark.parametrize("cls,opt,needle", [
    (SyntheticVideoTrainDataset, {"task": "inpaint"}, r"\.task' = 'inpaint' is not one of 'sr'"),
    (SyntheticVideoTrainDataset, {"task": "denoise", "scale": 4}, "'scale'"),
    (SyntheticVideoTrainDataset, {"task": "sr", "gt_size": 30}, "'gt_size'"),
    (SyntheticVideoTrainDataset, {"sigma_min": 40, "sigma_max": 10}, "'sigma_min'"),
    (SyntheticVideoTrainDataset, {"num_frame": "6"}, r"\.num_frame' must be integer"),
    (SyntheticVideoTrainDataset, {"num_frame": 0}, r"\.num_frame' = 0: must be >= 1"),
    (SyntheticVideoTrainDataset, {"num_frames": 6}, r"\.num_frames'; did you mean 'num_frame'"),
    (SyntheticVideoTestDataset, {"lq_size": [64]}, r"\.lq_size' = \[64\]"),
    (SyntheticVideoTestDataset, {"lq_size": [1, 64], "task": "sr", "scale": 2}, "'lq_size'"),
])
def test_bad_options_name_the_key(cls, opt, needle):
    with pytest.raises(ValueError, match=needle):
        cls(opt)


def test_index_out_of_range_and_dataloader_batches():
    ds = SyntheticVideoTrainDataset({**TRAIN, "task": "sr", "num_clips": 4})
    with pytest.raises(IndexError):
        ds[4]
    batch = next(iter(DataLoader(ds, batch_size=2, num_workers=0)))
    assert batch["L"].shape == (2, 3, 3, 8, 8) and batch["H"].shape == (2, 3, 3, 32, 32)
    assert list(ds) and len(list(ds)) == 4


def test_test_clips_degraded_like_training_are_fixed_per_clip():
    """``degradations`` on the validation set: the same LQ at every validation (drawn from (seed, index)), GT/scale,
    and not the clean bicubic LQ; only ``sr`` takes it."""
    opt = {"task": "sr", "num_clips": 2, "num_frame": 3, "lq_size": [24, 24], "scale": 2, "seed": 5}
    clean = SyntheticVideoTestDataset(opt)
    degraded = SyntheticVideoTestDataset({**opt, "degradations": "realbasicvsr"})
    a, b = degraded[1], SyntheticVideoTestDataset({**opt, "degradations": "realbasicvsr"})[1]
    assert torch.equal(a["L"], b["L"]) and torch.equal(a["H"], clean[1]["H"])
    assert a["L"].shape == clean[1]["L"].shape == (3, 3, 24, 24)
    assert (a["L"] - clean[1]["L"]).abs().mean() > 0.01
    assert not torch.equal(degraded[0]["L"][0], degraded[1]["L"][0])
    with pytest.raises(ValueError, match="'degradations' takes task 'sr'"):
        SyntheticVideoTestDataset({**opt, "task": "deblur", "scale": 1, "degradations": "realbasicvsr"})
