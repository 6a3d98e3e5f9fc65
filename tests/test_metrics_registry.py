"""The metric registry: names, directions, ground-truth and clip-length checks, one-line errors."""

from __future__ import annotations

import pytest

from utils.metrics import DEFAULT_METRICS, METRICS, MetricError, check_clip_length, resolve
from utils.metrics.weights import WEIGHTS


def test_kair_four_are_the_default_and_keep_their_log_format():
    assert DEFAULT_METRICS == ("psnr", "ssim", "psnr_y", "ssim_y")
    assert [METRICS[n].format(27.123) for n in DEFAULT_METRICS] == ["27.12 dB", "27.1230", "27.12 dB", "27.1230"]
    assert [METRICS[n].label for n in DEFAULT_METRICS] == ["PSNR", "SSIM", "PSNR_Y", "SSIM_Y"]


def test_every_entry_is_consistent():
    for name, spec in METRICS.items():
        assert spec.name == name
        assert set(spec.weights) <= set(WEIGHTS), name
        assert spec.min_frames == (2 if name in ("tof", "tlp") else 1), name
        assert spec.temporal == (name in ("tof", "tlp", "vmaf")), name
    lower = {n for n, s in METRICS.items() if not s.higher_is_better}
    assert lower == {"lpips", "lpips_vgg", "dists", "niqe", "tof", "tlp"}
    assert [n for n, s in METRICS.items() if not s.needs_gt] == ["niqe"]
    assert [n for n, s in METRICS.items() if not s.per_frame] == ["vmaf"]


def test_better_follows_the_direction():
    assert METRICS["psnr"].better(30.0, 29.0) and not METRICS["psnr"].better(29.0, 30.0)
    assert METRICS["lpips"].better(0.1, 0.2) and not METRICS["lpips"].better(0.2, 0.1)
    assert METRICS["niqe"].better(5.0, None)


def test_resolve_keeps_order_drops_repeats_ignores_case():
    assert [s.name for s in resolve(["LPIPS", "psnr", "lpips", " niqe"], have_gt=True)] == ["lpips", "psnr", "niqe"]
    assert [s.name for s in resolve(["niqe"], have_gt=False)] == ["niqe"]


def test_unknown_name_is_one_line_with_did_you_mean():
    with pytest.raises(MetricError) as err:
        resolve(["psnr", "lpis"], have_gt=True)
    assert "'lpis'" in str(err.value) and "did you mean 'lpips'" in str(err.value) and "\n" not in str(err.value)
    assert isinstance(err.value, ValueError)


def test_full_reference_without_gt_names_them_all():
    with pytest.raises(MetricError, match=r"metrics psnr, lpips, tof need ground truth.*\(niqe\)"):
        resolve(["psnr", "niqe", "lpips", "tof"], have_gt=False)


def test_clip_too_short_for_a_temporal_metric():
    specs = resolve(["psnr", "tof", "tlp"], have_gt=True)
    check_clip_length(specs, 2, "000")
    with pytest.raises(MetricError, match=r"clip '000' has 1 frame, too few for tof needs 2; tlp needs 2"):
        check_clip_length(specs, 1, "000")
