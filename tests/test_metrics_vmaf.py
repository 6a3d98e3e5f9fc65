"""VMAF through the libvmaf of imageio-ffmpeg's ffmpeg: frames streamed by the scorer equal ffmpeg scoring the same
frames saved as PNG files (its own RGB -> YUV), per frame and pooled, on a real H.264 video; libvmaf missing is one
line naming the extra."""

from __future__ import annotations

import json
import os
import subprocess

import cv2
import numpy as np
import pytest
import torch

from tests.support.metric_data import PAN_VIDEO, decode_rgb, pan_frames, to_tensor
from utils.metrics import MetricError, resolve
from utils.metrics import vmaf as vmaf_mod
from utils.metrics.niqe import rgb_to_y
from utils.metrics.scorer import MetricSuite

pytest.importorskip("imageio_ffmpeg")
pytest.importorskip("skimage")  # the sample photographs (requirements-dev.txt)
FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures", "metrics")


@pytest.fixture(scope="module")
def frames():
    """(output, GT) uint8 RGB: the decoded H.264 pan, blurred (VMAF is near 100 for the codec alone), and its source."""
    out = decode_rgb(os.path.join(FIXTURES, PAN_VIDEO))[:6]
    return np.stack([cv2.GaussianBlur(f, (0, 0), 1.2) for f in out]), pan_frames(6)


def _ffmpeg_on_pngs(out: np.ndarray, gt: np.ndarray, folder: str) -> tuple[list[float], float]:
    for name, clip in (("o", out), ("g", gt)):
        for i, f in enumerate(clip):
            cv2.imwrite(os.path.join(folder, f"{name}{i:03d}.png"), f[..., ::-1])
    log = os.path.join(folder, "vmaf.json")
    subprocess.run([vmaf_mod.ffmpeg_with_libvmaf(), "-hide_banner", "-loglevel", "error",
                    "-i", os.path.join(folder, "o%03d.png"), "-i", os.path.join(folder, "g%03d.png"),
                    "-lavfi", f"[0:v]format=yuv420p[d];[1:v]format=yuv420p[r];[d][r]libvmaf=log_fmt=json:"
                    f"log_path={log}", "-f", "null", "-"], check=True)
    rec = json.load(open(log))
    return [f["metrics"]["vmaf"] for f in rec["frames"]], rec["pooled_metrics"]["vmaf"]["mean"]


def test_vmaf_equals_ffmpeg_on_the_saved_frames(frames, tmp_path):
    out, gt = frames
    scorer = MetricSuite(resolve(["vmaf", "psnr"], True)).scorer("pan")
    rows = scorer.update(to_tensor(out[:4]), to_tensor(gt[:4]), 0) + scorer.update(to_tensor(out[4:]),
                                                                                   to_tensor(gt[4:]), 4)
    assert all("vmaf" not in r for r in rows)  # per clip: known once the clip is complete
    pooled = scorer.finish()["vmaf"]
    per_frame = [scorer.frame_values["vmaf"][i] for i in range(len(out))]
    want_frames, want_pooled = _ffmpeg_on_pngs(out, gt, str(tmp_path))
    assert 30 < want_pooled < 95  # a real, unsaturated score
    assert np.abs(np.array(per_frame) - want_frames).max() < 0.1
    assert abs(pooled - want_pooled) < 0.1
    assert pooled == pytest.approx(np.mean(per_frame), abs=1e-3)
    # the whole-clip function over saved luma gives the same numbers as the streaming scorer
    y = [[rgb_to_y(f).astype(np.uint8) for f in clip] for clip in (out, gt)]
    assert vmaf_mod.vmaf_clip(*y) == (per_frame, pooled)


def test_vmaf_cannot_be_primed():
    scorer = MetricSuite(resolve(["vmaf"], True)).scorer()
    with pytest.raises(MetricError, match="vmaf cannot continue a segment"):
        scorer.prime(torch.zeros(3, 8, 8), torch.zeros(3, 8, 8))


def test_libvmaf_missing_is_one_line(monkeypatch, tmp_path):
    import imageio_ffmpeg

    fake = tmp_path / "ffmpeg"
    fake.write_text("#!/bin/sh\necho ' .. scale  V->V  Scale the input video size.'\n")
    fake.chmod(0o755)
    monkeypatch.setattr(imageio_ffmpeg, "get_ffmpeg_exe", lambda: str(fake))
    vmaf_mod.ffmpeg_with_libvmaf.cache_clear()
    try:
        with pytest.raises(MetricError) as err:
            MetricSuite(resolve(["vmaf"], True))
        assert "built without libvmaf" in str(err.value) and '".[vmaf]"' in str(err.value)
        assert "\n" not in str(err.value)
        monkeypatch.setitem(__import__("sys").modules, "imageio_ffmpeg", None)  # not installed
        vmaf_mod.ffmpeg_with_libvmaf.cache_clear()
        with pytest.raises(MetricError, match=r"vmaf needs FFmpeg with libvmaf, which imageio-ffmpeg carries"):
            MetricSuite(resolve(["vmaf"], True))
    finally:
        vmaf_mod.ffmpeg_with_libvmaf.cache_clear()
