"""``main_test_vrt.py --report``: one self-contained HTML page written from the records of metrics.csv and
clips.csv (the per-clip table, a per-frame curve of each metric, a before/after comparison of each clip's middle
frame: input upscaled | output | ground truth), on photographs filmed by a panning camera; opened in a real headless
Chromium (Debian's package; skipped where it is absent): no console message, the script ran, the screenshot shows
the page."""

from __future__ import annotations

import base64
import csv
import logging
import os
import re
import shutil
import subprocess

import cv2
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from engine import evaluate
from tests.support.footage import conv_baseline, downscale, pan, write_clip
from utils.metrics import METRICS
from utils.utils_image import imread_rgb

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--no-first-run", "--disable-sync", "--hide-scrollbars",
                  "--enable-logging=stderr", "--v=0"]
METRIC_NAMES = ["psnr", "ssim", "psnr_y", "ssim_y", "niqe", "tof"]


@pytest.fixture(scope="module")
def evaluated(tmp_path_factory):
    """A x4 conv baseline restores two panned photographs (6 and 5 frames, 192 x 192) with ``--report``."""
    tmp = tmp_path_factory.mktemp("report")
    flags = conv_baseline(str(tmp))
    for clip, photo, frames in (("astronaut", "astronaut", 6), ("coffee", "coffee", 5)):
        gt = pan(photo, frames, (192, 192), start=(40, 60))
        write_clip(str(tmp / "gt"), clip, gt)
        write_clip(str(tmp / "lq"), clip, downscale(gt, 4))
    save = tmp / "out"
    for key in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
        os.environ.pop(key, None)
    code = evaluate.main([*flags, "--folder_lq",
                          str(tmp / "lq"), "--folder_gt", str(tmp / "gt"), "--metrics", *METRIC_NAMES,
                          "--save_result", "--report", "--num_workers", "0", "--device", "cpu", "--save_dir",
                          str(save)])
    assert code == 0
    logging.getLogger().handlers.clear()
    return tmp, save


def _images(page: str) -> list[tuple[str, np.ndarray]]:
    """(panel, RGB image) of every embedded comparison image, in page order."""
    found = re.findall(r'data-panel="(\w+)" alt="[^"]*" src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)
    assert found
    return [(panel, cv2.imdecode(np.frombuffer(base64.b64decode(data), np.uint8), cv2.IMREAD_COLOR)[..., ::-1])
            for panel, data in found]


def test_the_report_shows_the_records_of_the_csvs_and_the_compared_frames(evaluated) -> None:
    tmp, save = evaluated
    page = (save / "report.html").read_text()
    assert not re.search(r"(src|href)=\"(https?:)?//", page) and "@import" not in page  # nothing from elsewhere
    clips = list(csv.DictReader(open(save / "clips.csv")))
    assert [c["folder"] for c in clips] == ["astronaut", "coffee"]
    for clip in clips:  # the table: every clip's value of every metric, as the CSV has it
        row = re.search(rf'<tr><td><a href="#clip-{clip["folder"]}">.*?</tr>', page).group(0)
        cells = re.findall(r"<td[^>]*>([^<]*)</td>", row)  # after the clip's name (a link)
        assert cells[0] == clip["frames"]
        assert cells[1:] == [METRICS[m].format(float(clip[m])) for m in METRIC_NAMES]
    frames = list(csv.DictReader(open(save / "metrics.csv")))
    for clip in ("astronaut", "coffee"):  # a curve per metric: a point per frame that has a value
        section = re.search(rf'<section class="clip" id="clip-{clip}">.*?</section>', page, re.S).group(0)
        rows = [r for r in frames if r["folder"] == clip]
        plots = re.findall(r"<figcaption>(\S+) per frame.*?<polyline points=\"([^\"]+)\"", section)
        assert [p[0] for p in plots] == [METRICS[m].label for m in METRIC_NAMES]
        for (label, points), name in zip(plots, METRIC_NAMES):
            assert len(points.split()) == sum(1 for r in rows if r[name]), label
        tips = re.findall(r"<title>(\d+): ([\d.]+)", section)  # the tooltips hold the CSV's values
        assert tips[: len(rows)] == [(r["frame"], METRICS["psnr"].format(float(r["psnr"])).split()[0]) for r in rows]
    images = _images(page)
    assert [p for p, _ in images] == ["input", "output", "gt"] * 2
    for (clip, count), start in (((("astronaut", 6)), 0), (("coffee", 5), 3)):
        middle = f"{count // 2:08d}"  # the compared frame: the middle output frame
        assert f"frame {middle} (shown x3): drag the slider" in page  # 192 pixels wide, shown at 576
        inp, out, gt = (images[start + i][1] for i in range(3))
        saved = (imread_rgb(str(save / clip / f"{middle}.png")) * 255).round().astype(np.uint8)
        truth = (imread_rgb(str(tmp / "gt" / clip / f"{middle}.png")) * 255).round().astype(np.uint8)
        lq = torch.from_numpy(imread_rgb(str(tmp / "lq" / clip / f"{middle}.png"))).permute(2, 0, 1)[None]
        up = F.interpolate(lq, scale_factor=4, mode="bicubic", align_corners=False)[0].clamp(0, 1)
        assert np.array_equal(out, saved) and np.array_equal(gt, truth)
        assert np.array_equal(inp, up.mul(255).round().byte().permute(1, 2, 0).numpy())


def _chromium(*args: str, tmp) -> subprocess.CompletedProcess:
    profile = tmp / "profile"
    shutil.rmtree(profile, ignore_errors=True)
    return subprocess.run([CHROMIUM, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args], capture_output=True,
                          text=True, timeout=120, cwd=str(tmp))


@pytest.mark.skipif(CHROMIUM is None, reason="needs Chromium (Debian: apt-get install chromium; .ci/run does)")
def test_the_report_opens_in_a_headless_browser_without_errors(evaluated) -> None:
    tmp, save = evaluated
    url = (save / "report.html").as_uri()
    dom = _chromium("--virtual-time-budget=3000", "--dump-dom", url, tmp=tmp)
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert re.search(r'<body[^>]*data-ready="1"', dom.stdout), dom.stdout[:500]  # the script ran to its end
    assert dom.stdout.count('data-shown="gt|output"') == 2  # each clip's comparison: ground truth | output
    shot = tmp / "report.png"
    run = _chromium("--virtual-time-budget=3000", "--window-size=1280,1600", f"--screenshot={shot}", url, tmp=tmp)
    assert run.returncode == 0 and shot.is_file(), run.stderr[-2000:]
    console = [line for line in (dom.stderr + run.stderr).splitlines() if ":CONSOLE" in line]
    assert not console, console  # no error, warning or message from the page
    img = cv2.imread(str(shot))
    assert img.shape[:2] == (1600, 1280)
    background = np.all(np.abs(img.astype(int) - img[-1, -1].astype(int)) < 8, axis=2)
    assert 0.05 < 1 - background.mean() and float(img.std()) > 20  # the table, curves and photographs are drawn
