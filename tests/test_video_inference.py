"""Tiled video inference: tiling equivalences, blending weights, padding rule, VFI and the ``val`` options."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from models.video_inference import blend_weights, infer_video, pad_to_window, tile_starts

FIXTURE = os.path.join(os.path.dirname(__file__), "fixtures", "metrics", "tiling_reference.npz")


class PixelNet(nn.Module):
    """Purely local: each output pixel depends only on the same LQ pixel of the same frame."""

    def __init__(self, scale: int = 1, out_chans: int = 3) -> None:
        super().__init__()
        self.scale, self.out_chans = scale, out_chans
        self.calls: list[tuple[int, ...]] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls.append(tuple(x.shape))
        y = torch.sin(3 * x[:, :, : self.out_chans]) + x[:, :, -1:] ** 2
        b, d = y.shape[:2]
        y = F.interpolate(y.flatten(0, 1), scale_factor=self.scale, mode="nearest")
        return y.view(b, d, *y.shape[1:])


class GlobalNet(nn.Module):
    """Mixes all frames and pixels (a 3-D conv plus the global mean): any tiling changes its output."""

    def __init__(self, scale: int = 2) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(0)
        self.weight = nn.Parameter(torch.randn(3, 3, 3, 3, 3, generator=gen) * 0.1)
        self.scale = scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.conv3d(x.transpose(1, 2), self.weight, padding=1).transpose(1, 2) + x.mean()
        b, d = y.shape[:2]
        y = F.interpolate(y.flatten(0, 1), scale_factor=self.scale, mode="bilinear", align_corners=False)
        return y.view(b, d, *y.shape[1:])


def _video(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.rand(*shape, generator=torch.Generator().manual_seed(seed))


def test_one_tile_covering_the_clip_equals_untiled() -> None:
    net = GlobalNet(scale=2)
    lq = _video(1, 6, 3, 32, 40)  # fits the (6, 8, 8) window: no padding on either path
    whole = infer_video(net, lq, scale=2, window_size=(6, 8, 8))
    tiled = infer_video(net, lq, scale=2, window_size=(6, 8, 8), num_frame_testing=6, num_frame_overlapping=2,
                        size_patch_testing=64, overlap_size=20)
    assert whole.shape == (1, 6, 3, 64, 80) and whole.dtype == torch.float32 and whole.device.type == "cpu"
    torch.testing.assert_close(tiled, whole, rtol=0, atol=1e-6)
    # and the tiling of a global net is not a no-op (so the equivalences below are not vacuous)
    small = infer_video(net, lq, scale=2, window_size=(6, 8, 8), num_frame_testing=4, size_patch_testing=16,
                        overlap_size=4)
    assert (small - whole).abs().max() > 1e-3


@pytest.mark.parametrize(("scale", "shape", "nft", "nfo", "patch", "overlap"), [
    (4, (1, 7, 3, 40, 56), 3, 1, 16, 4),
    (1, (2, 9, 3, 36, 44), 4, 2, 16, 6),
    (2, (1, 5, 3, 24, 72), 0, 2, 24, 20),
    (1, (1, 11, 3, 20, 20), 5, 2, 0, 20),
])
def test_overlapping_tiles_of_a_local_net_equal_untiled(scale, shape, nft, nfo, patch, overlap) -> None:
    net = PixelNet(scale)
    lq = _video(*shape)
    reference = net(lq)
    out = infer_video(net, lq, scale=scale, window_size=(2, 8, 8), num_frame_testing=nft,
                      num_frame_overlapping=nfo, size_patch_testing=patch, overlap_size=overlap)
    assert out.shape == reference.shape
    torch.testing.assert_close(out, reference, rtol=0, atol=1e-6)
    if patch:
        assert all(c[-1] <= patch and c[-2] <= patch for c in net.calls[1:])
        assert len(net.calls) > 2


@pytest.mark.parametrize(("length", "tile", "overlap", "scale"), [
    (100, 32, 8, 1), (100, 32, 8, 4), (64, 64, 20, 2), (50, 64, 20, 1), (129, 40, 20, 3), (71, 16, 5, 2),
])
def test_blend_weights_sum_to_one(length, tile, overlap, scale) -> None:
    total = torch.zeros(length * scale)
    placed = blend_weights(length, tile, overlap, scale)
    for start, mask in placed:
        assert start + mask.numel() <= length * scale
        total[start:start + mask.numel()] += mask
    assert bool((total >= 1).all()), "some output pixel is covered by no patch"
    normalised = torch.zeros_like(total)
    for start, mask in placed:
        normalised[start:start + mask.numel()] += mask / total[start:start + mask.numel()]
    torch.testing.assert_close(normalised, torch.ones_like(total))
    # interior edges lose exactly overlap // 2 output pixels, image borders none
    if len(placed) > 1:
        first, last = placed[0][1], placed[-1][1]
        assert first[0] == 1 and int((first == 0).sum()) == overlap // 2
        assert last[-1] == 1 and int((last == 0).sum()) == overlap // 2


def test_tile_starts_official_rule() -> None:
    assert tile_starts(10, 4, 2) == [0, 2, 4, 6]
    assert tile_starts(11, 4, 2) == [0, 2, 4, 6, 7]
    assert tile_starts(3, 4, 2) == [0]
    with pytest.raises(ValueError, match="larger than its overlap"):
        tile_starts(10, 4, 4)


def test_padding_rule_leaves_a_fitting_clip_untouched() -> None:
    net = PixelNet()
    lq = _video(1, 6, 3, 16, 24)
    out = infer_video(net, lq, scale=1, window_size=(6, 8, 8))
    assert net.calls == [(1, 6, 3, 16, 24)]
    torch.testing.assert_close(out, net(lq))
    x, n = pad_to_window(lq, 1, 6)
    assert x is lq and n == 6


def test_padding_rule_mirrors_up_to_the_next_multiple() -> None:
    lq = torch.arange(5.0).view(1, 5, 1, 1, 1)
    x, n = pad_to_window(lq, 1, 4)
    assert n == 5 and x.flatten().tolist() == [0, 1, 2, 3, 4, 4, 3, 2]
    net = PixelNet()
    video = _video(1, 5, 3, 13, 20)
    out = infer_video(net, video, scale=1, window_size=(4, 8, 8))
    assert net.calls[0] == (1, 8, 3, 16, 24) and out.shape == (1, 5, 3, 13, 20)
    torch.testing.assert_close(out, net(video))


class VFINet(nn.Module):
    """D frames -> 1: a weighted mean of the inputs (so reversing the input changes the result)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[int, ...]] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls.append(tuple(x.shape))
        w = torch.arange(1.0, x.shape[1] + 1).view(1, -1, 1, 1, 1)
        return (x * w).sum(1, keepdim=True) / w.sum()


def test_vfi_four_frames_to_one() -> None:
    net = VFINet()
    lq = _video(1, 4, 3, 32, 48)
    out = infer_video(net, lq, scale=1, window_size=(4, 8, 8), vfi=True, num_frame_testing=2)
    assert out.shape == (1, 1, 3, 32, 48)
    assert net.calls == [(1, 4, 3, 32, 48)]  # whole clip, no temporal tiling or padding
    torch.testing.assert_close(out, net(lq))
    tiled = infer_video(net, lq, scale=1, window_size=(4, 8, 8), vfi=True, size_patch_testing=16, overlap_size=4)
    torch.testing.assert_close(tiled, net(lq))
    flipped = infer_video(net, lq, scale=1, window_size=(4, 8, 8), vfi=True, flip_seq=True)
    torch.testing.assert_close(flipped, 0.5 * (net(lq) + net(lq.flip(1))))
    with pytest.raises(ValueError, match="pad_seq"):
        infer_video(net, lq, scale=1, window_size=(4, 8, 8), vfi=True, pad_seq=True)


def test_nonblind_denoising_four_channels_in_three_out() -> None:
    net = PixelNet(out_chans=3)
    lq = _video(1, 5, 4, 24, 24)
    out = infer_video(net, lq, scale=1, window_size=(6, 8, 8), in_chans=4, num_frame_testing=3,
                      num_frame_overlapping=1, size_patch_testing=16, overlap_size=4)
    assert out.shape == (1, 5, 3, 24, 24)
    torch.testing.assert_close(out, net(lq))
    with pytest.raises(ValueError, match="reads 4 input channels, the input has 3"):
        infer_video(net, lq[:, :, :3], scale=1, window_size=(6, 8, 8), in_chans=4)


def test_val_options_pad_flip_center() -> None:
    net = GlobalNet(scale=1)
    lq = _video(1, 5, 3, 16, 16)
    kw = {"scale": 1, "window_size": (2, 8, 8)}
    plain = infer_video(net, lq, **kw)
    padded = infer_video(net, lq, pad_seq=True, **kw)
    expect_pad = infer_video(net, torch.cat([lq, lq[:, -1:]], 1), **kw)[:, :5]
    torch.testing.assert_close(padded, expect_pad)
    flipped = infer_video(net, lq, flip_seq=True, **kw)
    both = infer_video(net, torch.cat([lq, lq.flip(1)], 1), **kw)
    torch.testing.assert_close(flipped, 0.5 * (both[:, :5] + both[:, 5:].flip(1)))
    center = infer_video(net, lq, center_frame_only=True, **kw)
    assert center.shape == (1, 1, 3, 16, 16)
    torch.testing.assert_close(center, plain[:, 2:3])


def test_bad_arguments_are_reported() -> None:
    net = PixelNet()
    with pytest.raises(ValueError, match="multiple of the window"):
        infer_video(net, _video(1, 2, 3, 16, 16), scale=1, window_size=(2, 8, 8), size_patch_testing=12)
    with pytest.raises(ValueError, match=r"\(B, D, C, h, w\)"):
        infer_video(net, _video(2, 3, 16, 16), scale=1, window_size=(2, 8, 8))


@pytest.mark.skipif(not os.path.exists(FIXTURE), reason="tiling fixture not generated")
def test_matches_the_official_test_video_on_a_fixture() -> None:
    """Golden outputs of the official script's ``test_video`` (run on GlobalNet's weights in a scratch dir).

    The fixture holds, per tiling setting, every 5th output pixel and per-frame projections of the whole output
    on a seeded random tensor (so a difference anywhere shows up).
    """
    data = np.load(FIXTURE)
    scale = int(data["scale"])
    net = GlobalNet(scale=scale)
    with torch.no_grad():
        net.weight.copy_(torch.from_numpy(data["weight"]))
    lq = torch.from_numpy(data["lq_u8"]).float() / 255
    for i, (tile, overlap) in enumerate(zip(data["tiles"], data["overlaps"])):
        out = infer_video(net, lq, scale=scale, window_size=tuple(int(v) for v in data["window_size"]),
                          num_frame_testing=int(tile[0]), num_frame_overlapping=int(overlap[0]),
                          size_patch_testing=int(tile[1]), overlap_size=int(overlap[1]))
        torch.testing.assert_close(out[..., 1::5, 2::5], torch.from_numpy(data[f"sub{i}"]), rtol=0, atol=1e-6)
        weights = torch.rand(out.shape, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
        proj = (out.double() * weights).sum(dim=(2, 3, 4))
        # If every pixel is within 1e-6 (float32 rounding differs between CPUs' SIMD widths), the projection is
        # within 1e-6 times the sum of the weights; a wrong seam or blend weight moves it by far more.
        bound = 1e-6 * weights.sum(dim=(2, 3, 4))
        diff = (proj - torch.from_numpy(data[f"proj{i}"])).abs()
        assert bool((diff <= bound).all()), f"tiling {i}: projection off by {diff.max():.3g} > {bound.min():.3g}"
