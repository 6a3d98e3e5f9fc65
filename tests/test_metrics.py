"""PSNR / SSIM / Y-channel metrics: analytic cases and golden values from KAIR's utils_image on fixture images."""

from __future__ import annotations

import json
import math
import os

import numpy as np
import pytest
import torch

from utils.utils_image import (
    bgr2ycbcr,
    calculate_psnr,
    calculate_ssim,
    frame_metrics,
    imread_rgb,
    imwrite_rgb,
    rgb2ycbcr,
    tensor2uint,
)

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures", "metrics")
IMAGES = np.load(os.path.join(FIXTURES, "images.npz"))
with open(os.path.join(FIXTURES, "values.json")) as _f:
    GOLDEN = json.load(_f)["values"]
NAMES = sorted(GOLDEN)


def _pair(name: str) -> tuple[np.ndarray, np.ndarray]:
    return IMAGES[f"{name}_a"], IMAGES[f"{name}_b"]


def _y(img: np.ndarray) -> np.ndarray:
    return bgr2ycbcr(img.astype(np.float32) / 255.0) * 255.0


@pytest.mark.parametrize("name", NAMES)
def test_psnr_ssim_equal_the_reference(name: str) -> None:
    a, b = _pair(name)
    ref = GOLDEN[name]
    assert calculate_psnr(a, b) == pytest.approx(ref["psnr"], rel=0, abs=1e-10)
    assert calculate_ssim(a, b) == pytest.approx(ref["ssim"], rel=0, abs=1e-10)
    assert calculate_psnr(a, b, border=4) == pytest.approx(ref["psnr_border4"], rel=0, abs=1e-10)
    assert calculate_ssim(a, b, border=4) == pytest.approx(ref["ssim_border4"], rel=0, abs=1e-10)
    assert calculate_ssim(a[..., 1], b[..., 1]) == pytest.approx(ref["ssim_gray"], rel=0, abs=1e-10)
    assert calculate_psnr(_y(a), _y(b)) == pytest.approx(ref["psnr_y"], rel=0, abs=1e-10)
    assert calculate_ssim(_y(a), _y(b)) == pytest.approx(ref["ssim_y"], rel=0, abs=1e-10)


@pytest.mark.parametrize("name", NAMES)
def test_ycbcr_equal_the_reference(name: str) -> None:
    a, _ = _pair(name)
    ref = GOLDEN[name]
    a_copy = a.copy()
    y8 = bgr2ycbcr(a, only_y=True)
    assert y8.dtype == np.uint8 and int(y8.astype(np.int64).sum()) == ref["y_uint8_sum"]
    ycc8 = bgr2ycbcr(a, only_y=False)
    assert ycc8.shape == a.shape and ycc8.astype(np.int64).sum((0, 1)).tolist() == ref["ycbcr_uint8_sum"]
    af = a.astype(np.float32) / 255.0
    af_copy = af.copy()
    yf = rgb2ycbcr(af)
    assert yf.dtype == np.float32
    assert float(yf.astype(np.float64).sum()) == pytest.approx(ref["rgb2y_float_sum"], rel=1e-12)
    yccf = bgr2ycbcr(af, only_y=False).astype(np.float64).sum((0, 1))
    np.testing.assert_allclose(yccf, ref["ycbcr_float_sum"], rtol=1e-12)
    # inputs are never modified (KAIR's version scales float inputs in place)
    np.testing.assert_array_equal(a, a_copy)
    np.testing.assert_array_equal(af, af_copy)


def test_rgb_and_bgr_conversions_are_mirror_images() -> None:
    a, _ = _pair("noise5")
    np.testing.assert_array_equal(rgb2ycbcr(a[..., ::-1]), bgr2ycbcr(a))
    assert rgb2ycbcr(np.array([[[0, 0, 0]]], np.uint8))[0, 0] == 16
    assert rgb2ycbcr(np.array([[[255, 255, 255]]], np.uint8))[0, 0] == 235


def test_identical_images_give_inf_psnr_and_unit_ssim() -> None:
    a, _ = _pair("blur")
    assert calculate_psnr(a, a) == math.inf
    assert calculate_ssim(a, a) == pytest.approx(1.0, abs=1e-12)


@pytest.mark.parametrize("d", [1, 3, 10])
def test_constant_offset_psnr(d: int) -> None:
    img = np.full((32, 40, 3), 100, np.uint8)
    assert calculate_psnr(img, img + np.uint8(d)) == pytest.approx(20 * math.log10(255 / d), abs=1e-12)


def test_shape_mismatch_and_tiny_images_are_errors() -> None:
    a = np.zeros((16, 16, 3), np.uint8)
    with pytest.raises(ValueError, match="same shape"):
        calculate_psnr(a, a[:8])
    with pytest.raises(ValueError, match="larger than 10x10"):
        calculate_ssim(a, a, border=3)


@pytest.mark.parametrize("name", NAMES)
def test_frame_metrics_follow_the_validation_loop(name: str) -> None:
    a, b = _pair(name)  # uint8 BGR

    def as_tensor(img: np.ndarray) -> torch.Tensor:  # the float RGB (3, H, W) frame that rounds back to img
        return torch.from_numpy(img[..., ::-1].astype(np.float32) / 255).permute(2, 0, 1).contiguous()

    got = frame_metrics(as_tensor(b), as_tensor(a))
    for key in ("psnr", "ssim", "psnr_y", "ssim_y"):
        assert got[key] == pytest.approx(GOLDEN[name][key], rel=0, abs=1e-10), key


def test_frame_metrics_clamp_and_round() -> None:
    gen = torch.Generator().manual_seed(0)
    gt = torch.rand(3, 24, 24, generator=gen)
    out = gt + 0.3 * torch.randn(3, 24, 24, generator=gen)  # values far outside [0, 1]
    got = frame_metrics(out, gt)
    img, ref = tensor2uint(out, bgr=True), tensor2uint(gt, bgr=True)
    assert got["psnr"] == calculate_psnr(img, ref) and got["ssim"] == calculate_ssim(img, ref)
    gray = frame_metrics(out[:1], gt[:1])
    assert gray["psnr_y"] == gray["psnr"] and gray["ssim_y"] == gray["ssim"]


def test_tensor2uint_channel_order() -> None:
    t = torch.zeros(3, 2, 2)
    t[0] = 1.0  # pure red
    assert tensor2uint(t)[0, 0].tolist() == [255, 0, 0]
    assert tensor2uint(t, bgr=True)[0, 0].tolist() == [0, 0, 255]
    assert tensor2uint(torch.full((3, 1, 1), 0.5))[0, 0, 0] == 128  # 127.5 -> 128 (half to even)


def test_image_io_round_trip(tmp_path) -> None:
    gen = torch.Generator().manual_seed(0)
    frame = torch.rand(3, 12, 20, generator=gen)
    path = str(tmp_path / "a" / "b" / "frame.png")
    imwrite_rgb(path, frame)
    back = imread_rgb(path)
    assert back.shape == (12, 20, 3) and back.dtype == np.float32
    np.testing.assert_array_equal((back * 255).round().astype(np.uint8), tensor2uint(frame))
    imwrite_rgb(str(tmp_path / "c.png"), back)
    np.testing.assert_array_equal(imread_rgb(str(tmp_path / "c.png")), back)
    with pytest.raises(FileNotFoundError, match="missing.png"):
        imread_rgb(str(tmp_path / "missing.png"))
