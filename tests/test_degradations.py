"""On-the-fly degradations (data/degradations.py, degradation_codec.py, degradation_ops.py, degradation_pipeline.py):
the statistics of each operation, exact output sizes, the BI/BD presets against generate_lq's numbers, the same
bytes from the same seed (twice, in another process at other thread counts, and through loader workers), and
one-line option errors."""

from __future__ import annotations

import hashlib
import json
import math
import os
import random
import re
import sys

import cv2
import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from data import degradation_codec
from data import degradations as dg
from data.dataset_synthetic import render_clip
from data.degradation_codec import available_encoders, compress_clip
from data.degradation_ops import Context
from data.degradation_pipeline import (
    DEGRADATION_OPTIONS,
    OPERATIONS,
    PRESETS,
    DegradationError,
    build_degradation,
    check_degradations,
)
from scripts.data_preparation.degradations import bd_degrade, bi_degrade, to_uint8
from tests.support.helpers import ROOT, assert_ok, base_env, run
from utils.utils_dataloader import SeededItems, seeded_rng
from utils.utils_option import OptionError, check_value

# every operation at once, every codec of the wheel, parameters drifting over the frames
ALL_OPS = [
    {"type": "blur", "kernel": ["aniso", "generalized_aniso", "plateau_iso", "sinc"], "vary": 0.5},
    {"type": "resize", "scale": [0.6, 1.4]},
    {"type": "noise", "gaussian_prob": 0.5, "vary": 0.5},
    {"type": "jpeg", "quality": [40, 90], "vary": 0.5},
    *[{"type": "codec", "codec": c, "crf": [20, 40], "qscale": [3, 12]} for c in available_encoders()],
    {"type": "shuffle", "groups": [[{"type": "resize", "to": "target"}], [{"type": "noise", "gaussian_prob": 0}]]},
    {"type": "quantize"},
]
CTX = Context(target=(15, 20), scale=4)  # a 60x80 GT at x4
# run in another process at 2 threads: the digests of ALL_OPS on seeds 0..2, and x265 on small frames that crash
# the wheel's x265 unless padded (a heap corruption would kill the process, not fail an assert)
CHILD = """
import hashlib, json, sys
import cv2, numpy as np, torch
cv2.setNumThreads(2); torch.set_num_threads(2)
from data.dataset_synthetic import render_clip
from data.degradation_codec import compress_clip
from data.degradation_pipeline import build_degradation
specs, seeds = json.loads(sys.argv[1]), json.loads(sys.argv[2])
gt = render_clip(np.random.default_rng(0), 6, 64, 64)
for h, w in ((20, 36), (24, 40)):
    compress_clip(np.random.default_rng(1).random((4, h, w, 3), dtype=np.float32), "libx265", crf=30)
print(json.dumps([[hashlib.sha256(build_degradation(spec, 4)(gt, np.random.default_rng(s)).tobytes()).hexdigest()
                   for s in seeds] for spec in specs]))
"""
CHILD_SPECS = [ALL_OPS, "realbasicvsr"]  # every operation; the preset whose codecs run in bitrate mode


@pytest.fixture(scope="module")
def clip() -> np.ndarray:
    """A textured, moving GT clip: (6, 64, 64, 3) float32 on the 8-bit levels."""
    return render_clip(np.random.default_rng(0), 6, 64, 64)


def _digest(x: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(x).tobytes()).hexdigest()


def _psnr(a: np.ndarray, b: np.ndarray) -> float:
    return 10 * math.log10(1 / float(np.mean((a.astype(np.float64) - b) ** 2)))


def test_kernels_sum_to_one_with_their_shape_and_symmetry():
    kernels = {
        "iso": dg.gaussian_kernel(21, 2.0),
        "aniso": dg.gaussian_kernel(21, 3.0, 1.0, 0.0),
        "generalized": dg.generalized_gaussian_kernel(15, 2.0, 1.0, 0.7, 0.5),
        "plateau": dg.plateau_kernel(13, 2.0, 1.0, 0.3, 1.5),
        "sinc": dg.sinc_kernel(11, 1.2),
    }
    for name, k in kernels.items():
        assert k.shape[0] == k.shape[1] and k.shape[0] % 2 == 1, name
        assert abs(k.sum() - 1) < 1e-12, name
        np.testing.assert_allclose(k, k[::-1, ::-1], atol=1e-15, err_msg=name)  # point symmetric
        assert k.argmax() == k.size // 2, name  # peak in the middle
    iso = kernels["iso"]
    np.testing.assert_allclose(iso, iso.T, atol=1e-15)
    r = np.arange(21) - 10
    assert abs((iso.sum(0) * r ** 2).sum() - 4.0) < 0.01  # variance sigma^2 (5 sigma fit in the 21 taps)
    aniso = kernels["aniso"]  # sigma 3 along x (columns), 1 along y (rows)
    assert (aniso.sum(0) * r ** 2).sum() > 8 * (aniso.sum(1) * r ** 2).sum()
    np.testing.assert_allclose(dg.generalized_gaussian_kernel(21, 2.0, 1.0, 0.4, 1.0),
                               dg.gaussian_kernel(21, 2.0, 1.0, 0.4), atol=1e-15)  # beta 1 is the Gaussian
    assert kernels["sinc"].min() < 0  # ringing lobes
    # drawn kernels: odd sizes in range, each summing to 1, one per frame with vary
    blur = build_degradation([{"type": "blur", "kernel_size": [7, 13], "vary": 1}], 1).ops[0]
    for seed in range(8):
        kind, ks = blur.draw_kernels(np.random.default_rng(seed), 5)
        assert ks.shape[0] == 5 and ks.shape[1] in (7, 9, 11, 13), kind
        np.testing.assert_allclose(ks.sum(axis=(1, 2)), 1, atol=1e-12)


def test_blur_is_separable_exactly_where_it_should_be():
    x = np.random.default_rng(0).random((2, 40, 50, 3), dtype=np.float32)
    # 1-D passes; a 2-D filter; OpenCV's DFT path for large kernels (all in place)
    for k in (dg.gaussian_kernel(9, 2.0), dg.gaussian_kernel(9, 2.0, 0.5, 0.3), dg.sinc_kernel(21, 0.8)):
        direct = np.stack([cv2.filter2D(f, -1, k.astype(np.float32), borderType=cv2.BORDER_REFLECT_101) for f in x])
        np.testing.assert_allclose(dg.filter_clip(x, k), direct, atol=2e-6)
    np.testing.assert_allclose(dg.filter_clip(np.full((1, 8, 8, 3), 0.3, np.float32), dg.sinc_kernel(7, 1.0)), 0.3,
                               atol=1e-6)  # kernels sum to 1: a flat clip stays flat


def test_gaussian_noise_std_and_drift():
    flat = np.full((4, 96, 96, 3), 0.5, np.float32)
    sigma = np.array([4.0, 8.0, 12.0, 16.0])
    noisy = dg.add_gaussian_noise(flat, sigma, False, np.random.default_rng(0))
    std = (noisy - 0.5).reshape(4, -1).std(axis=1) * 255
    np.testing.assert_allclose(std, sigma, rtol=0.03)
    grey = dg.add_gaussian_noise(flat, sigma, True, np.random.default_rng(0))
    assert np.array_equal(grey[..., 0], grey[..., 2]) and not np.array_equal(noisy[..., 0], noisy[..., 2])
    # the operation: sigma drawn in its range, drifting from the first to the last frame with vary
    op = build_degradation([{"type": "noise", "gaussian_prob": 1, "gray_prob": 0, "sigma": [2, 30], "vary": 1}],
                           1).ops[0]
    drifts = []
    for seed in range(6):
        out = op(np.full((8, 48, 48, 3), 0.5, np.float32), np.random.default_rng(seed), None, None)
        s = (out - 0.5).reshape(8, -1).std(axis=1) * 255
        assert s.min() > 2 * 0.9 and s.max() < 30 * 1.1
        drifts.append(s[-1] - s[0])
    assert max(abs(d) for d in drifts) > 2  # the level changes over the clip


def test_poisson_noise_scales_with_the_level_and_the_scale():
    flat = np.full((2, 128, 128, 3), 128 / 255, np.float32)
    stds = []
    for scale in (1.0, 2.0):
        out = dg.add_poisson_noise(flat, np.full(2, scale), False, np.random.default_rng(0))
        noise = (out - flat) * 255
        assert abs(noise.mean()) < 0.05 * scale  # unbiased
        stds.append(noise.std())
    assert stds[0] == pytest.approx(math.sqrt(128), rel=0.03)  # shot noise: std sqrt(level) at scale 1
    assert stds[1] / stds[0] == pytest.approx(2, rel=0.03)
    dark = dg.add_poisson_noise(np.full((1, 128, 128, 3), 8 / 255, np.float32), np.ones(1), True,
                                np.random.default_rng(0))
    assert np.array_equal(dark[..., 0], dark[..., 1])  # grey: shared by the channels
    assert ((dark - 8 / 255) * 255).std() == pytest.approx(math.sqrt(8), rel=0.05)


def test_jpeg_and_codec_error_fall_with_quality_crf_qscale_and_bitrate(clip):
    psnr = [_psnr(dg.jpeg_clip(clip, np.full(6, q)), clip) for q in (20, 50, 90)]
    assert psnr[0] < psnr[1] < psnr[2], psnr
    settings = {"libx264": ("crf", (42, 30, 18)), "libx265": ("crf", (42, 30, 18)),
                "mpeg4": ("qscale", (24, 10, 2)), "libvpx-vp9": ("crf", (55, 35, 15))}
    # bitrate mode (the realbasicvsr preset's): bits per second at 25 fps, low to high
    bitrates = {"libx264": (1e4, 3e4, 1e5), "libx265": (1e4, 3e4, 1e5), "mpeg4": (1e3, 3e3, 1e4),
                "libvpx-vp9": (1e3, 3e3, 1e4)}
    for codec in available_encoders():
        key, values = settings[codec]
        psnr = [_psnr(compress_clip(clip, codec, **{key: v}), clip) for v in values]
        assert psnr[0] < psnr[1] < psnr[2], (codec, psnr)
        psnr = [_psnr(compress_clip(clip, codec, bitrate=b, fps=25), clip) for b in bitrates[codec]]
        assert psnr[0] < psnr[1] < psnr[2], (codec, "bitrate", psnr)
        assert _digest(compress_clip(clip, codec, bitrate=3e3, fps=25)) == _digest(
            compress_clip(clip, codec, bitrate=3e3, fps=25)), codec  # repeatable, as crf / qscale are
    # inter-frame coding: changing frame 0 changes the decoded frame 4, whose input is the same (JPEG: it does not)
    other = clip.copy()
    other[0] = clip[0, ::-1]
    assert not np.array_equal(compress_clip(clip, "libx264", crf=30)[4], compress_clip(other, "libx264", crf=30)[4])
    assert np.array_equal(dg.jpeg_clip(clip, np.full(6, 50))[4], dg.jpeg_clip(other, np.full(6, 50))[4])


def test_codecs_repeat_on_clips_where_the_wheel_s_encoders_did_not():
    """x264's AVX-512 code gave 2 different outputs in 150 encodes of this 64x64 clip, x265 up to 12 in 60 of the
    40x40 one (padded to 64): both are now repeatable (x264 capped at AVX2 there, x265 padded to 128)."""
    clip = render_clip(np.random.default_rng(0), 6, 64, 64)
    assert len({_digest(compress_clip(clip, "libx264", crf=30)) for _ in range(16)}) == 1
    if "libx265" in available_encoders():
        small = dg.resize_clip(clip, (40, 40), "area")
        assert len({_digest(compress_clip(small, "libx265", crf=30)) for _ in range(8)}) == 1


def test_resize_factors_stay_in_their_ranges():
    x = np.zeros((1, 60, 80, 3), np.float32)
    for direction, lo, hi in (([1, 0, 0], 1, 2), ([0, 1, 0], 0.5, 1), ([0, 0, 1], 1, 1)):
        op = build_degradation([{"type": "resize", "scale": [0.5, 2], "direction_prob": direction}], 4).ops[0]
        for seed in range(5):
            h, w = op(x, np.random.default_rng(seed), CTX, None).shape[1:3]
            assert round(60 * lo) <= h <= round(60 * hi) and round(80 * lo) <= w <= round(80 * hi)
            assert abs(h / 60 - w / 80) < 0.02  # one factor for both axes
    op = build_degradation([{"type": "resize", "direction_prob": [0, 0, 1], "relative_to": "target"}], 4).ops[0]
    assert op(x, np.random.default_rng(0), CTX, None).shape[1:3] == (15, 20)  # kept at GT/4, not at the input
    flat = np.full((2, 60, 80, 3), 0.25, np.float32)
    for mode in ("area", "bilinear", "bicubic"):
        np.testing.assert_allclose(dg.resize_clip(flat, (23, 31), mode), 0.25, atol=1e-6)


def test_every_preset_gives_exactly_gt_over_scale_and_leaves_gt_alone():
    gt8 = (render_clip(np.random.default_rng(1), 3, 50, 70) * 255).round().astype(np.uint8)
    random_sizes = [{"type": "resize", "scale": [0.1, 3.0], "direction_prob": [1, 1, 0]} for _ in range(3)]
    cases = [(name, s) for name in PRESETS for s in (2, 4)] + [("second_order", 3), ("bi", 1), ("realesrgan", 1)]
    ringing = [{"type": "blur", "kernel": "sinc"}]  # overshoots [0, 1] at edges: the LQ is clipped at the end
    for spec, scale in cases + [(random_sizes, 4), (random_sizes, 3), (ringing, 1)]:
        degrade = build_degradation(spec, scale)
        for gt in (gt8, gt8.astype(np.float32) / 255):
            before = gt.copy()
            for seed in range(2):
                lq = degrade(gt, np.random.default_rng(seed))
                assert lq.shape == (3, 50 // scale, 70 // scale, 3) and lq.dtype == np.float32, (spec, scale)
                assert 0 <= lq.min() and lq.max() <= 1 and not np.shares_memory(lq, gt)
            assert np.array_equal(gt, before)
        view = gt8.transpose(0, 2, 1, 3)[:, ::-1]  # a rotated view, as augmentation may hand over
        np.testing.assert_array_equal(degrade(view, np.random.default_rng(5)),
                                      degrade(np.ascontiguousarray(view), np.random.default_rng(5)))
    with pytest.raises(DegradationError, match="bd needs a scale of at least 2"):
        build_degradation("bd", 1)


def test_torch_cpu_tensors_in_give_tensors_with_the_same_values_out():
    gt8 = (render_clip(np.random.default_rng(1), 3, 32, 40) * 255).round().astype(np.uint8)
    degrade = build_degradation("realbasicvsr", 4)
    for gt in (gt8, gt8.astype(np.float32) / 255):
        tensor = torch.from_numpy(gt.copy())
        lq = degrade(tensor, np.random.default_rng(3))
        assert isinstance(lq, torch.Tensor) and lq.dtype == torch.float32 and lq.shape == (3, 8, 10, 3)
        assert np.array_equal(lq.numpy(), degrade(gt, np.random.default_rng(3)))
        assert torch.equal(tensor, torch.from_numpy(gt)) and not np.shares_memory(lq.numpy(), gt)
    view = torch.from_numpy(gt8).permute(0, 2, 1, 3).flip(1)  # a non-contiguous tensor
    assert torch.equal(degrade(view, np.random.default_rng(0)),
                       degrade(view.contiguous(), np.random.default_rng(0)))
    with pytest.raises(ValueError, match=r"uint8 or float32 array or CPU tensor, got float64 \(2, 8, 8, 3\)"):
        degrade(torch.zeros(2, 8, 8, 3, dtype=torch.float64), np.random.default_rng(0))
    with pytest.raises(ValueError, match="without grad"):
        degrade(torch.zeros(2, 8, 8, 3, requires_grad=True), np.random.default_rng(0))


def test_bi_and_bd_presets_equal_generate_lq():
    gt = (render_clip(np.random.default_rng(2), 2, 48, 64) * 255).round().astype(np.uint8)
    for name, reference in (("bi", bi_degrade), ("bd", bd_degrade)):
        lq = build_degradation(name, 4)(gt, np.random.default_rng(0))
        expected = np.stack([to_uint8(reference(frame, 4)) for frame in gt])
        assert np.array_equal(np.rint(lq * 255).astype(np.uint8), expected), name


def test_preset_changes_and_descriptions():
    degrade = build_degradation({"preset": "realbasicvsr", "codec1": {"codec": ["libx265"], "crf": [20, 30],
                                                                      "bitrate": None}, "jpeg2": None}, 4)
    names = degrade.describe()
    assert "codec1(libx265; crf [20, 30])" in names and "jpeg2" not in names and "jpeg1" in names
    assert "\n" not in names and names.startswith("degradations 'realbasicvsr' x4: blur1(")


class _Degraded(Dataset):
    """Item i: ALL_OPS on a fixed GT clip, from a generator seeded by the item's module RNG (as datasets do)."""

    def __init__(self, gt: np.ndarray) -> None:
        self.gt = gt
        self.degrade = build_degradation(ALL_OPS, 4)

    def __len__(self) -> int:
        return 4

    def __getitem__(self, index: int) -> str:
        return _digest(self.degrade(self.gt, np.random.default_rng(np.random.randint(2 ** 31))))


def test_same_seed_same_bytes_twice_in_workers_and_in_another_process(clip):
    cv2_threads, torch_threads = cv2.getNumThreads(), torch.get_num_threads()
    cv2.setNumThreads(1)
    torch.set_num_threads(1)
    try:
        here = [[_digest(build_degradation(spec, 4)(clip, np.random.default_rng(s))) for s in range(3)]
                for spec in CHILD_SPECS]
        degrade = build_degradation(ALL_OPS, 4)
        assert here[0] == [_digest(degrade(clip, np.random.default_rng(s))) for s in range(3)]
        assert len(set(here[0])) == len(set(here[1])) == 3
        # through SeededItems: the same bytes with 0 or 2 loader workers, in any order
        items = SeededItems(_Degraded(clip), seed=7)
        keys = [(1, i) for i in range(4)]
        serial = [items[k] for k in keys]
        with seeded_rng(12345):
            assert serial == [items[k] for k in reversed(keys)][::-1]
        workers = list(DataLoader(items, sampler=keys, batch_size=None, num_workers=2))
        assert workers == serial
    finally:
        cv2.setNumThreads(cv2_threads)
        torch.set_num_threads(torch_threads)
    proc = run([sys.executable, "-c", CHILD, json.dumps(CHILD_SPECS), json.dumps([0, 1, 2])], base_env(threads=2),
               ROOT, timeout=120)
    assert_ok(proc)
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == here


def test_bad_options_are_one_line_errors(monkeypatch):
    spec = DEGRADATION_OPTIONS["degradations"]
    cases = {
        "nope": "unknown preset 'nope'; presets: bi, bd, realesrgan, realbasicvsr, second_order",
        "[noise sigma]": "option 'degradations.noise1.sigma' = [30, 1]: must satisfy 0 <= low <= high <= 255",
        "[blur typo]": "unknown option 'degradations.blur1.sigmaa'; did you mean 'sigma'?",
        "[kernel]": "option 'degradations.blur1.kernel' = ['box']: must be one or a list of: iso, aniso",
        "[codec crf]": "option 'degradations.codec1.crf' = 60: must be <= 51 for libx264",
        "[override]": "preset 'bi' has no operation 'jpeg1'; its operations: bi, quantize",
        "[type]": "degradations[1]: unknown operation type 'sharpen'; types: blur, resize, noise, jpeg, codec",
    }
    values = {"nope": "nope", "[noise sigma]": [{"type": "noise", "sigma": [30, 1]}],
              "[blur typo]": [{"type": "blur", "sigmaa": 1}], "[kernel]": [{"type": "blur", "kernel": ["box"]}],
              "[codec crf]": [{"type": "codec", "crf": 60}], "[override]": {"preset": "bi", "jpeg1": {}},
              "[type]": [{"type": "blur"}, {"type": "sharpen"}]}
    for key, value in values.items():
        with pytest.raises(OptionError) as err:
            check_value("VideoFileTrainDataset.degradations", value, spec)
        message = str(err.value)
        assert "\n" not in message and message.startswith("option 'VideoFileTrainDataset.degradations' = ")
        assert cases[key] in message, message
        with pytest.raises(DegradationError, match=re.escape(cases[key])):
            build_degradation(value, 4)
    check_value("x.degradations", None, spec)  # null: no degradation
    monkeypatch.setattr(degradation_codec, "available_encoders", lambda: ("libx264", "mpeg4"))
    assert check_degradations([{"type": "codec", "codec": ["libx264", "vp9"]}]) == (
        "option 'degradations.codec1.codec' = ['libx264', 'vp9']: codec 'vp9' is not in this PyAV build; "
        "available: libx264, mpeg4")


def test_the_docs_name_every_operation_and_key():
    text = open(os.path.join(ROOT, "docs", "datasets.md"), encoding="utf-8").read()
    section = text.split("## Degradations on the fly", 1)[1].split("\n## ", 1)[0]
    for kind, cls in OPERATIONS.items():
        assert f"`{kind}`" in section, kind
        for key in cls.PARAMS:
            assert f"`{key}`" in section, (kind, key)
    for name in (*PRESETS, "second_order"):
        assert f"`{name}`" in section, name


# ---------------------------------------------------------------------------------------------- draws over items
# One operation of each kind, each with a chance to run and choices with unequal weights.
DRAWN_OPS = [
    {"type": "blur", "prob": 0.7, "kernel": ["iso", "aniso", "generalized_iso", "plateau_aniso", "sinc"],
     "kernel_prob": [0.3, 0.3, 0.1, 0.1, 0.2], "kernel_size": [7, 21], "sigma": [0.2, 3.0]},
    {"type": "resize", "direction_prob": [0.2, 0.7, 0.1], "scale": [0.5, 1.5]},
    {"type": "noise", "prob": 0.6, "gaussian_prob": 0.5, "sigma": [1, 30], "poisson_scale": [0.05, 3],
     "gray_prob": 0.4},
    {"type": "jpeg", "prob": 0.5, "quality": [30, 95]},
    {"type": "codec", "prob": 0.5, "codec": ["libx264", "mpeg4"], "codec_prob": [2 / 3, 1 / 3], "crf": [18, 35],
     "qscale": [2, 20]},
]
ITEMS = 300
# Each check below fails a correct implementation with probability at most ALPHA: a two-sided binomial or chi-square
# p-value, a Kolmogorov-Smirnov p-value, or the chance (1 - r)^n that n uniform draws all miss the outer fraction r
# of a range at one end (r is set from n so that this is ALPHA). With 36 checks the test's false-failure rate under
# another seed is below 4e-4; with this seed it passes or fails the same way every time.
ALPHA = 1e-5


def _spy_operations(monkeypatch) -> list[tuple]:
    """Record each drawn parameter (kind, value) in a list, and make the operations themselves cheap."""
    from data import degradation_ops

    seen: list[tuple] = []
    real_draw = degradation_ops.Blur.draw_kernels

    def draw(self, rng, frames):
        start = len(seen)
        kind, kernels = real_draw(self, rng, frames)
        seen[start:] = [(*d, kind) for d in seen[start:]]  # the Gaussian's sigmas, labelled with their kernel kind
        seen.append(("blur", kind, kernels.shape[-1]))
        return kind, kernels

    def gaussian(size, sx, sy, angle):
        seen.append(("sigma", sx, sy, angle))
        return np.ones((size, size)) / size**2

    def resize(clip, size, mode):
        seen.append(("resize", size[0] / clip.shape[1], mode))
        return np.zeros((clip.shape[0], *size, 3), np.float32)

    def noise(kind):
        return lambda clip, level, gray, rng: seen.append((kind, float(level[0]), gray)) or clip

    monkeypatch.setattr(degradation_ops.Blur, "draw_kernels", draw)
    monkeypatch.setattr(dg, "gaussian_kernel", gaussian)
    monkeypatch.setattr(dg, "filter_clip", lambda clip, kernel: clip)
    monkeypatch.setattr(dg, "resize_clip", resize)
    monkeypatch.setattr(dg, "add_gaussian_noise", noise("gaussian"))
    monkeypatch.setattr(dg, "add_poisson_noise", noise("poisson"))
    monkeypatch.setattr(dg, "jpeg_clip", lambda clip, quality: seen.append(("jpeg", int(quality[0]))) or clip)
    monkeypatch.setattr(degradation_ops, "compress_clip", lambda clip, codec, **rate: seen.append(
        ("codec", codec, rate.get("crf", rate.get("qscale")))) or clip)
    return seen


def _binomial_ok(count: int, n: int, p: float) -> bool:
    from scipy.stats import binomtest

    return binomtest(count, n, p).pvalue > ALPHA


def _categories_ok(values: list, weights: dict) -> bool:
    from scipy.stats import chisquare

    total = sum(weights.values())
    observed = [values.count(k) for k in weights]
    return len(values) == sum(observed) and chisquare(observed, [len(values) * w / total for w in weights.values()]
                                                      ).pvalue > ALPHA


def _covers(values: list[float], low: float, high: float, uniform: bool = True) -> bool:
    """Inside [low, high], reaching both ends (into the outer fraction that n uniform draws all miss with probability
    ALPHA), and (``uniform``) uniform by K-S."""
    from scipy.stats import kstest

    reach = (1 - ALPHA ** (1 / max(len(values), 1))) * (high - low)
    inside = all(low <= v <= high for v in values) and min(values) < low + reach and max(values) > high - reach
    return inside and (not uniform or kstest(values, "uniform", args=(low, high - low)).pvalue > ALPHA)


def test_an_epoch_draws_every_parameter_over_its_range_with_its_probability(tmp_path, monkeypatch):
    """Through the video-file training set and SeededItems (each item's generator): across an epoch the blur kernel,
    resize, noise, JPEG and codec parameters cover their configured ranges with the configured probabilities; items
    differ from each other, and an item differs between epochs."""
    from data.dataset_video_file_train import VideoFileTrainDataset
    from data.synthetic_videos import synthesize_videos

    synthesize_videos(str(tmp_path / "videos"), {"num_videos": 1, "num_frames": 6, "size": [64, 64], "seed": 0})
    ds = VideoFileTrainDataset({"dataroot_gt": str(tmp_path / "videos"), "num_frame": 2, "gt_size": 64, "scale": 2,
                                "clips_per_video": ITEMS, "use_hflip": False, "use_rot": False,
                                "index_dir": str(tmp_path / "index"), "degradations": DRAWN_OPS})
    seen = _spy_operations(monkeypatch)
    items = SeededItems(ds, seed=3)

    def draws_of(key: tuple[int, int]) -> tuple:
        start = len(seen)
        items[key]
        return tuple(seen[start:])

    epoch0 = [draws_of((0, i)) for i in range(ITEMS)]
    # an item that drew a continuous value (a Gaussian sigma, a noise level) cannot repeat another one by chance (an
    # item that drew only discrete ones may: a kept size, a mode, a quality); items that drew one all differ, and
    # differ from themselves in the next epoch
    continuous = [i for i, item in enumerate(epoch0) if any(d[0] in ("sigma", "gaussian", "poisson") for d in item)]
    assert len(continuous) > ITEMS // 2
    assert len({epoch0[i] for i in continuous}) == len(continuous)
    assert all(draws_of((1, i)) != epoch0[i] for i in continuous[:2])
    draws = [d for item in epoch0 for d in item]
    by = {kind: [d[1:] for d in draws if d[0] == kind] for kind in ("blur", "sigma", "resize", "gaussian", "poisson",
                                                                     "jpeg", "codec")}
    blur, codec, noise = by["blur"], by["codec"], by["gaussian"] + by["poisson"]
    checks = {
        "blur runs with prob 0.7": _binomial_ok(len(blur), ITEMS, 0.7),
        "kernel kinds by kernel_prob": _categories_ok([k for k, _ in blur], dict(zip(DRAWN_OPS[0]["kernel"],
                                                                                   DRAWN_OPS[0]["kernel_prob"]))),
        "kernel sizes 7..21, odd, uniform": _categories_ok([s for _, s in blur], dict.fromkeys(range(7, 22, 2), 1)),
        "sigma over [0.2, 3]": _covers([sx for sx, _, _, _ in by["sigma"]], 0.2, 3.0),
        "iso kernels round": all(sy == sx and a == 0 for sx, sy, a, kind in by["sigma"] if kind == "iso"),
        "aniso sigma_y over [0.2, 3]": _covers([sy for _, sy, _, kind in by["sigma"] if kind == "aniso"], 0.2, 3.0),
        "aniso angle over [-pi, pi]": _covers([a for _, _, a, kind in by["sigma"] if kind == "aniso"], -math.pi,
                                              math.pi),
        "resize runs every time": len(by["resize"]) == ITEMS,
        "resize up/down/keep by direction_prob": _categories_ok(
            ["up" if f > 1 else "down" if f < 1 else "keep" for f, _ in by["resize"]],
            {"up": 0.2, "down": 0.7, "keep": 0.1}),
        "down factor over [0.5, 1]": _covers([f for f, _ in by["resize"] if f < 1], 0.5, 1.0, uniform=False),
        "up factor over [1, 1.5]": _covers([f for f, _ in by["resize"] if f > 1], 1.0, 1.5, uniform=False),
        "resize modes equally likely": _categories_ok([m for _, m in by["resize"]],
                                                      dict.fromkeys(dg.RESIZE_MODES, 1)),
        "noise runs with prob 0.6": _binomial_ok(len(noise), ITEMS, 0.6),
        "gaussian noise with prob 0.5": _binomial_ok(len(by["gaussian"]), len(noise), 0.5),
        "grey noise with prob 0.4": _binomial_ok(sum(g for _, g in noise), len(noise), 0.4),
        "gaussian sigma over [1, 30]": _covers([s for s, _ in by["gaussian"]], 1, 30),
        "poisson scale over [0.05, 3]": _covers([s for s, _ in by["poisson"]], 0.05, 3),
        "jpeg runs with prob 0.5": _binomial_ok(len(by["jpeg"]), ITEMS, 0.5),
        "jpeg quality over [30, 95]": _covers([q for (q,) in by["jpeg"]], 30, 95),
        "codec runs with prob 0.5": _binomial_ok(len(codec), ITEMS, 0.5),
        "codecs by codec_prob": _categories_ok([c for c, _ in codec], {"libx264": 2 / 3, "mpeg4": 1 / 3}),
        "x264 crf over 18..35": _categories_ok([(r - 18) // 3 for c, r in codec if c == "libx264"],
                                               dict.fromkeys(range(6), 1)),
        "mpeg4 qscale over 2..20": _covers([r for c, r in codec if c == "mpeg4"], 2, 20, uniform=False),
    }
    assert all(checks.values()), [name for name, ok in checks.items() if not ok]


def test_the_draws_come_from_the_generator_alone(monkeypatch, clip):
    """The same generator state gives the same parameters, whatever the global random streams did in between."""
    seen = _spy_operations(monkeypatch)
    degrade = build_degradation(DRAWN_OPS, 2)
    runs = []
    for global_seed in (1, 2):
        random.seed(global_seed)
        np.random.seed(global_seed)
        torch.manual_seed(global_seed)
        start = len(seen)
        for s in range(8):
            degrade(clip, np.random.default_rng(s))
        runs.append(seen[start:])
    assert runs[0] == runs[1] and any(d[0] == "codec" for d in runs[0])


def test_shuffle_runs_its_groups_in_either_order(monkeypatch):
    first = []
    monkeypatch.setattr(dg, "jpeg_clip", lambda clip, quality: first.append("jpeg") or clip)
    monkeypatch.setattr(dg, "quantize", lambda clip: first.append("quantize") or clip)
    degrade = build_degradation([{"type": "shuffle", "groups": [[{"type": "jpeg"}], [{"type": "quantize"}]]}], 1)
    for seed in range(200):
        degrade(np.zeros((1, 4, 4, 3), np.float32), np.random.default_rng(seed))
    assert len(first) == 400 and _binomial_ok(first[::2].count("jpeg"), 200, 0.5)


def test_the_last_resize_to_gt_over_scale_shrinks_by_area_and_enlarges_bicubic(monkeypatch, clip):
    from data import degradation_pipeline

    modes = []
    real = degradation_pipeline.resize_clip
    monkeypatch.setattr(degradation_pipeline, "resize_clip", lambda c, size, mode: modes.append(mode) or real(
        c, size, mode))
    for direction in ([1, 0, 0], [0, 1, 0]):  # up from GT/4 (16 -> 16..32, then shrunk), down (16 -> 8..16)
        build_degradation([{"type": "resize", "relative_to": "target", "scale": [0.5, 2], "direction_prob": direction,
                            "mode": "area"}], 4)(clip, np.random.default_rng(0))
    assert modes == ["area", "bicubic"]
