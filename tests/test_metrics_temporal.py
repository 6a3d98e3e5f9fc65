"""tOF and tLP equal TecoGAN's own metrics.py (frozen by scripts/reference/make_metric_fixtures.py) on a real H.264
video with camera motion; a clip scored in chunks or in primed segments gives the whole clip's values bit for bit."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch

from tests.support.metric_data import PAN_VIDEO, decode_rgb, make_weights, pan_frames, to_tensor
from utils.metrics import MetricError, resolve
from utils.metrics.scorer import MetricSuite, frames_per_forward
from utils.utils_image import frame_metrics

pytest.importorskip("skimage")  # the sample photographs (requirements-dev.txt)
FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures", "metrics")
REF = json.load(open(os.path.join(FIXTURES, "reference_metrics.json")))


@pytest.fixture(scope="module")
def clip():
    """(output, GT): the decoded H.264 pan and its source frames, (10, 3, 288, 384) each."""
    return to_tensor(decode_rgb(os.path.join(FIXTURES, PAN_VIDEO))), to_tensor(pan_frames())


@pytest.fixture(scope="module")
def weights(tmp_path_factory):
    return make_weights(str(tmp_path_factory.mktemp("metric_weights")), seed=REF["tecogan_weights_seed"])


@pytest.fixture(scope="module")
def suite(weights):
    return MetricSuite(resolve(["psnr", "lpips", "niqe", "tof", "tlp"], True), "cpu", weights, verify=False)


def test_tof_tlp_equal_tecogan(clip, suite, one_thread):
    out, gt = clip
    scorer = suite.scorer("pan")
    rows = scorer.update(out, gt, 0)
    assert "tof" not in rows[0] and "tlp" not in rows[0]  # frame 0 has no previous frame
    # 3e-8 apart here; the room is for OpenCV's and oneDNN's SIMD paths on other CPUs (the deliberate breaks move
    # values by 9-30%)
    for t, want in REF["tof"].items():
        assert rows[int(t)]["tof"] == pytest.approx(want, rel=1e-3), t
    for t, want in REF["tlp"].items():
        assert rows[int(t)]["tlp"] == pytest.approx(want, rel=1e-4), t
    assert [r["psnr"] for r in rows] == [frame_metrics(o, g)["psnr"] for o, g in zip(out, gt)]  # KAIR's, unchanged
    clip_mean = scorer.finish()
    assert clip_mean["tof"] == pytest.approx(np.mean([r["tof"] for r in rows[1:]]))


def test_segments_and_chunks_score_as_the_whole_clip(clip, suite, one_thread):
    out, gt = clip
    whole = suite.scorer().update(out, gt, 0)
    chunked = suite.scorer()
    rows = [r for a, b in ((0, 3), (3, 4), (4, 10)) for r in chunked.update(out[a:b], gt[a:b], a)]
    assert rows == whole
    segment = suite.scorer()  # a second process restoring frames 6..9 sees frame 5 only through prime()
    segment.prime(out[5], gt[5], index=5)
    assert segment.update(out[6:], gt[6:], 6) == whole[6:]
    with pytest.raises(ValueError, match="does not continue frame 9"):
        chunked.update(out[:1], gt[:1], 0)


def test_frames_batched_in_a_forward_score_as_the_whole_clip(clip, weights, one_thread):
    """Off the CPU the metric networks take several frames a forward (scorer.frames_per_forward); a frame's value
    must still not depend on how the clip was cut into chunks and segments. Four frames a forward on the CPU here:
    the whole clip, uneven chunks and a primed segment put frames in different batches and leave different
    remainders."""
    out, gt = clip
    batched = MetricSuite(resolve(["lpips", "tlp"], True), "cpu", weights, verify=False, batch_frames=4)
    whole = batched.scorer().update(out, gt, 0)
    chunked = batched.scorer()
    assert [r for a, b in ((0, 3), (3, 4), (4, 10)) for r in chunked.update(out[a:b], gt[a:b], a)] == whole
    segment = batched.scorer()
    segment.prime(out[4], gt[4], index=4)
    assert segment.update(out[5:], gt[5:], 5) == whole[5:]
    single = MetricSuite(batched.specs, "cpu", weights, verify=False, batch_frames=1).scorer().update(out, gt, 0)
    for row, one in zip(whole, single):  # batching moves values by rounding only
        assert row.keys() == one.keys()
        assert all(abs(row[k] - one[k]) <= 1e-6 * max(1.0, abs(one[k])) for k in row)


def test_frames_per_forward_batches_off_the_cpu_only():
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert frames_per_forward(cpu, 256, 256) == 1
    assert [frames_per_forward(cuda, h, w) for h, w in ((64, 64), (256, 256), (720, 1280), (1080, 1920),
                                                         (2160, 3840))] == [8, 8, 2, 1, 1]


def test_a_seam_is_a_spike(clip, suite, one_thread):
    """A frame restored differently from its neighbours (a tile seam, a flicker) stands out in the per-frame curve."""
    out, gt = clip
    bad = out.clone()
    bad[6, :, :, 192:] = torch.roll(bad[6, :, :, 192:], 3, dims=-1)  # the right half of frame 6 slips 3 px
    rows = suite.scorer().update(bad, gt, 0)
    for name in ("tof", "tlp"):
        curve = [r[name] for r in rows[1:]]
        assert np.argmax(curve) + 1 in (6, 7), (name, curve)  # pairs (5, 6) and (6, 7) hold the seam


def test_a_clip_too_short_and_missing_gt(clip, suite):
    out, gt = clip
    scorer = suite.scorer("one")
    scorer.update(out[:1], gt[:1], 0)
    with pytest.raises(MetricError, match=r"clip 'one' has 1 frame, too few for tof needs 2; tlp needs 2"):
        scorer.finish()
    primed = suite.scorer("seg")  # one frame after a primed one is a pair
    primed.prime(out[0], gt[0])
    assert "tof" in primed.update(out[1:2], gt[1:2], 1)[0]
    with pytest.raises(MetricError, match="psnr, lpips, tof, tlp need ground truth, which clip 'x' lacks"):
        suite.scorer("x").update(out[:2], None, 0)
