"""The metric registry where it is used: log lines (KAIR's unchanged, the others after them), ``main_test_vrt.py
--metrics`` on footage without ground truth, every bad input as one line with exit code 2 and nothing written,
atomic CSVs and report, and validation during training on the user's own videos (no GT) with the best step picked
by a no-reference metric (``models/best.json``), on a photograph filmed by a panning camera (H.264)."""

from __future__ import annotations

import copy
import csv
import glob
import json
import logging
import math
import os
import re
import sys

import pytest
import torch

import main_train_vrt
from engine import evaluate, scoring
from engine.eval_results import write_csv
from engine.options import parse_options
from engine.report import ClipReport, write_report
from engine.scoring import average_lines, baseline_text, metric_specs
from engine.validate import BestSoFar
from tests.support.footage import conv_baseline, downscale, pan, write_clip, write_footage
from tests.support.helpers import ROOT, TINY_OPT
from utils.metrics import METRICS
from utils.metrics.niqe import niqe_rgb
from utils.utils_image import imread_rgb


# ----------------------------------------------------------------------------------------------- log lines
def test_kair_lines_stay_byte_for_byte_and_the_others_follow_on_lines_of_their_own() -> None:
    values = {"psnr": 27.123, "ssim": 0.78123, "psnr_y": 28.43, "ssim_y": 0.80012, "lpips": 0.12345, "niqe": 4.5,
              "tof": 0.4321, "vmaf": 91.234}
    kair = metric_specs(None, True)
    assert scoring.testing_lines("000", 0, 4, values, kair) == [
        "Testing 000                  ( 0/4) - PSNR: 27.12 dB; SSIM: 0.7812; PSNR_Y: 28.43 dB; SSIM_Y: 0.8001"]
    assert average_lines(values, kair) == ["Average PSNR: 27.12 dB; SSIM: 0.7812; PSNR_Y: 28.43 dB; SSIM_Y: 0.8001"]
    everything = metric_specs(["vmaf", "tof", "niqe", "lpips", "ssim_y", "psnr_y", "ssim", "psnr"], True)
    assert [s.name for s in everything] == ["psnr", "ssim", "psnr_y", "ssim_y", "lpips", "niqe", "tof", "vmaf"]
    lines = scoring.testing_lines("000", 0, 4, values, everything)
    assert lines[0] == scoring.testing_lines("000", 0, 4, values, kair)[0]
    assert lines[1] == "Testing 000                  ( 0/4) + LPIPS: 0.1235; NIQE: 4.5000; tOF: 0.4321; VMAF: 91.23"
    assert average_lines(values, everything)[1] == "Average LPIPS: 0.1235; NIQE: 4.5000; tOF: 0.4321; VMAF: 91.23"
    no_gt = scoring.testing_lines("walk", 1, 2, {"niqe": 4.5}, metric_specs(["niqe"], False))
    assert no_gt == ["Testing walk                 ( 1/2) + NIQE: 4.5000"]
    assert scoring.testing_lines("walk", 1, 2, None, []) == ["Testing walk                 ( 1/2) - no ground truth"]
    base = baseline_text(values, everything)
    assert base.endswith("PSNR 27.12 dB; SSIM 0.7812; PSNR_Y 28.43 dB; SSIM_Y 0.8001; LPIPS 0.1235; NIQE 4.5000; "
                         "tOF 0.4321; VMAF 91.23")
    assert "- PSNR:" not in base and "Average" not in base  # never read by KAIR's parsers as the model's score


# ----------------------------------------------------------------------------------------------- best step
def test_best_so_far_follows_each_metrics_direction_and_survives_a_resume(tmp_path) -> None:
    best = BestSoFar("lpips", {"test": True, "test_footage": False})
    best.update({"test": {"psnr": 20.0, "lpips": 0.30}, "test_footage": {"niqe": 6.0}}, 100)
    best.update({"test": {"psnr": 21.0, "lpips": 0.35}, "test_footage": {"niqe": 5.0}}, 200)
    best.update({"test": {"psnr": 19.0, "lpips": 0.25}, "test_footage": {"niqe": 7.0}}, 300)
    state = best.state()
    assert state["metrics"] == {"test/psnr": {"value": 21.0, "step": 200}, "test/lpips": {"value": 0.25, "step": 300},
                                "test_footage/niqe": {"value": 5.0, "step": 200}}
    assert (state["metric"], state["set"], state["step"], state["psnr"]) == ("lpips", "test", 300, 21.0)
    resumed = BestSoFar("lpips", {"test": True, "test_footage": False}, state)  # from {step}_state.pth
    resumed.update({"test": {"psnr": 20.5, "lpips": 0.26}, "test_footage": {"niqe": 5.5}}, 400)
    assert resumed.state() == state  # nothing beat the bests kept through the resume
    lines = resumed.lines({"test": {"psnr": 20.5, "lpips": 0.26}, "test_footage": {"niqe": 5.5}}, "models")
    assert lines == ["Best PSNR: 21.00 dB at step 200", "Best LPIPS: 0.2500 at step 300 (models/300_G.pth)",
                     "Best NIQE on test_footage: 5.0000 at step 200"]
    resumed.write_json(str(tmp_path), saved=lambda step: step % 200 == 0)
    written = json.loads((tmp_path / "best.json").read_text())
    assert written["step"] == 300 and written["value"] == 0.25 and written["checkpoint"] is None  # 300 not saved
    assert not [p for p in os.listdir(tmp_path) if p != "best.json"]  # no temporary left
    # a no-reference best metric is read from the set without ground truth (your footage)
    assert BestSoFar("niqe", {"test": True, "test_footage": False}).source == "test_footage"
    assert BestSoFar("niqe", {"test": True}).source == "test"
    old = BestSoFar("psnr", {"test": True}, {"psnr": 27.5, "step": 500})  # a checkpoint from before val.metrics
    assert old.best == {"value": 27.5, "step": 500}


# ----------------------------------------------------------------------------------------------- main_test_vrt
@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    """A x4 conv baseline (weights and option file); a panned photograph as a 6-frame clip (GT 128 x 128, LQ
    bicubic) and as H.264 footage without GT; a 1-frame clip; weight files of the wrong contents."""
    tmp = tmp_path_factory.mktemp("metrics")
    conv_baseline(str(tmp))
    gt = pan(frames=6)
    write_clip(str(tmp / "gt"), "pan", gt)
    write_clip(str(tmp / "lq"), "pan", downscale(gt, 4))
    write_clip(str(tmp / "short_gt"), "one", gt[:1])
    write_clip(str(tmp / "short_lq"), "one", downscale(gt[:1], 4))
    write_clip(str(tmp / "small_lq"), "small", downscale(pan(frames=2, size=(64, 64)), 4))  # restored: 64 x 64
    # 48 x 48 footage, 192 x 192 restored: four 96 x 96 NIQE blocks
    write_footage(str(tmp / "footage" / "coffee.mp4"), downscale(pan("coffee", 5, (192, 192), start=(40, 60)), 4))
    (tmp / "bad_weights").mkdir()
    from utils.metrics.weights import WEIGHTS

    for key in ("alexnet", "lpips_alex"):
        torch.save({"features.0.weight": torch.zeros(1)}, tmp / "bad_weights" / WEIGHTS[key].filename)
    return tmp


def _main(ws, *args: str) -> int:
    return evaluate.main(["--opt", str(ws / "opt.json"), "--model_path", str(ws / "w.pth"), "--num_workers", "0",
                          "--device", "cpu", *args])


@pytest.fixture()
def one_process(monkeypatch):
    for key in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
        monkeypatch.delenv(key, raising=False)


CASES = {
    "unknown name": (["--metrics", "psnr", "lpis"], "gt", r"unknown metric 'lpis': did you mean 'lpips'\?"),
    "full reference without GT": (["--metrics", "niqe", "psnr", "tof"], None,
                                  r"metrics psnr, tof need ground truth, which is missing; without it only "
                                  r"no-reference metrics can be computed \(niqe\)"),
    "clip too short": (["--metrics", "psnr", "tof"], "short", r"clip 'one' has 1 frame, too few for tof needs 2"),
    "frames too small": (["--metrics", "niqe"], "small",
                         r"niqe needs frames holding two 96x96 blocks \(at least 96x192 or 192x96 pixels\), got 64x64"),
    "weights with the wrong hash": (["--metrics", "lpips", "--metric_weights", "{ws}/bad_weights"], "gt",
                                    r"metric weights .*alexnet-owt-7be5be79\.pth have SHA-256 [0-9a-f]{64}, "
                                    r"expected 7be5be79"),
    "libvmaf missing": (["--metrics", "vmaf"], "gt", r"vmaf needs FFmpeg with libvmaf, which imageio-ffmpeg carries: "
                                                     r"pip install imageio-ffmpeg"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_metric_input_is_one_line_exit_2_and_nothing_written(workspace, case, caplog, monkeypatch,
                                                                 one_process) -> None:
    flags, data, message = CASES[case]
    if case == "libvmaf missing":
        from utils.metrics import vmaf

        monkeypatch.setitem(sys.modules, "imageio_ffmpeg", None)  # what `import imageio_ffmpeg` meets without it
        vmaf.ffmpeg_with_libvmaf.cache_clear()
    inputs = {"gt": ["--folder_lq", str(workspace / "lq"), "--folder_gt", str(workspace / "gt")],
              "short": ["--folder_lq", str(workspace / "short_lq"), "--folder_gt", str(workspace / "short_gt")],
              "small": ["--folder_lq", str(workspace / "small_lq")],
              None: ["--folder_lq", str(workspace / "lq")]}[data]
    out = workspace / f"bad_{case.replace(' ', '_')}"
    with caplog.at_level(logging.ERROR):
        code = _main(workspace, *inputs, *[f.format(ws=workspace) for f in flags], "--save_result", "--report",
                     "--save_dir", str(out))
    if case == "libvmaf missing":
        from utils.metrics import vmaf

        vmaf.ffmpeg_with_libvmaf.cache_clear()
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert code == 2 and len(errors) == 1 and "\n" not in errors[0], errors
    assert errors[0].startswith("error: ")
    assert re.search(message, errors[0]), errors[0]
    assert not out.exists()  # no frames, no metrics.csv, no report


def test_no_reference_metrics_score_footage_without_ground_truth(workspace, caplog, one_process) -> None:
    """``--metrics niqe`` on an H.264 video without GT: NIQE of each restored frame (the saved PNGs), in metrics.csv
    and clips.csv, on a line of its own after KAIR's ``no ground truth`` line."""
    out = workspace / "footage_out"
    with caplog.at_level(logging.INFO):
        assert _main(workspace, "--folder_lq", str(workspace / "footage"), "--metrics", "niqe", "--save_result",
                     "--save_dir", str(out)) == 0
    rows = list(csv.DictReader(open(out / "metrics.csv")))
    names = sorted(os.listdir(out / "coffee"))
    assert [r["frame"] for r in rows] == [n[:-4] for n in names] and list(rows[0]) == ["folder", "frame", "niqe"]
    expected = [niqe_rgb((imread_rgb(str(out / "coffee" / n)) * 255).round().astype("uint8")) for n in names]
    assert [float(r["niqe"]) for r in rows] == pytest.approx(expected, abs=1e-9)
    (clip,) = list(csv.DictReader(open(out / "clips.csv")))
    assert clip == {"folder": "coffee", "frames": "5", "niqe": repr(sum(expected) / len(expected))}
    text = caplog.text
    assert "Testing coffee               ( 0/1) + NIQE: " in text and "-- Average NIQE: " in text
    assert "Average PSNR" not in text


def test_tables_and_report_are_written_atomically(tmp_path) -> None:
    """A write that fails half-way leaves the previous file whole and no temporary behind."""
    path = str(tmp_path / "metrics.csv")
    write_csv(path, ["folder", "frame", "psnr"], [["a", "0", 30.0]])
    before = open(path).read()
    with pytest.raises(UnicodeEncodeError):
        write_csv(path, ["folder", "frame", "psnr"], [["a", "0", 31.0], ["b\ud800", "1", 32.0]])
    assert open(path).read() == before and os.listdir(tmp_path) == ["metrics.csv"]
    spec = [METRICS["psnr"]]
    page = write_report(str(tmp_path / "report.html"), "t", spec, [ClipReport("a", ["0"], [{"psnr": 30.0}],
                                                                               {"psnr": 30.0})], {"psnr": 30.0})
    before = open(page).read()
    with pytest.raises(UnicodeEncodeError):
        write_report(page, "t\ud800", spec, [], {})
    assert open(page).read() == before and sorted(os.listdir(tmp_path)) == ["metrics.csv", "report.html"]


# ----------------------------------------------------------------------------------------------- training
REALWORLD_RECIPES = sorted(glob.glob(os.path.join(ROOT, "options", "*", "*_realworld_*.json")))


@pytest.mark.parametrize("path", [p for p in REALWORLD_RECIPES if "_demo" not in p], ids=os.path.basename)
def test_realworld_recipes_validate_with_lpips_and_niqe_and_pick_the_best_by_lpips(path, tmp_path) -> None:
    """The real-world recipes (GAN and pixel stages of VRT and RVRT): ``val.metrics`` has LPIPS and NIQE beside
    KAIR's four, the best step is LPIPS's (lower is better, on the set with ground truth), and the commented
    ``test_footage`` section (the user's own videos, no GT) parses once its ``//`` is removed."""
    opt = parse_options(path)
    names = [s.name for s in metric_specs(opt["val"]["metrics"], True)]
    assert names[:4] == ["psnr", "ssim", "psnr_y", "ssim_y"] and {"lpips", "niqe"} <= set(names)
    assert opt["val"]["best_metric"] == "lpips" and not METRICS["lpips"].higher_is_better
    best = BestSoFar(opt["val"]["best_metric"], {"test": True, "test_footage": False})
    assert best.source == "test"
    text = open(path, encoding="utf-8").read()
    commented = re.findall(r"^(\s*)// (, \"test_footage\": .*)$", text, re.M)
    assert len(commented) == 1, path
    mine = tmp_path / os.path.basename(path)
    mine.write_text(text.replace(f"// {commented[0][1]}", commented[0][1]))
    footage = parse_options(str(mine))["datasets"]["test_footage"]
    assert footage["dataset_type"] == "VideoFileTestDataset" and footage["dataroot_lq"]
    assert not footage.get("dataroot_gt")


def test_training_validates_on_own_footage_without_gt_and_picks_the_best_by_niqe(workspace, tmp_path, monkeypatch,
                                                                                   capsys) -> None:
    """``datasets.test_footage``: the user's videos, no ground truth, scored with NIQE beside the synthetic GT set
    (whose 64 x 64 frames are too small for NIQE: it is left out there, with a warning); ``val.best_metric: niqe``
    picks the step on the footage; TensorBoard gets ``val_footage/NIQE``."""
    opt = copy.deepcopy(TINY_OPT)
    opt["datasets"]["test_footage"] = {"name": "my_videos", "dataset_type": "VideoFileTestDataset",
                                       "dataroot_lq": str(workspace / "footage")}
    opt["train"].update(total_iter=2, checkpoint_test=1, checkpoint_save=2)
    opt["val"] = {"metrics": ["psnr", "ssim", "psnr_y", "ssim_y", "niqe"], "best_metric": "niqe"}
    opt["path"]["root"] = str(tmp_path / "experiments")
    (tmp_path / "opt.json").write_text(json.dumps(opt))
    for key in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.chdir(tmp_path)
    try:
        assert main_train_vrt.main(["--opt", str(tmp_path / "opt.json")]) == 0
    finally:
        logging.getLogger().handlers.clear()
    task = tmp_path / "experiments" / "tiny"
    log = (task / "train.log").read_text()
    assert log.count("Validation on datasets.test_footage (1 clip):") == 2
    assert log.count("Testing coffee               ( 0/1) - no ground truth") == 2
    niqe = [float(v) for v in re.findall(r"Testing coffee\s+\( 0/1\) \+ NIQE: ([\d.]+)", log)]
    assert len(niqe) == 2 and log.count("Average NIQE: ") == 2  # the footage's, at steps 1 and 2
    assert log.count("val.metrics: niqe is left out on datasets.test (niqe needs frames holding two 96x96 blocks") == 1
    assert re.search(r"Input baseline \(.*\): NIQE [\d.]+$", log, re.M)  # the footage's
    best = json.loads((task / "models" / "best.json").read_text())
    step = 1 + min(range(2), key=lambda i: niqe[i])  # lower NIQE is better
    assert (best["metric"], best["set"], best["step"]) == ("niqe", "test_footage", step)
    assert best["checkpoint"] == (f"{step}_G.pth" if step == 2 else None)  # step 1 is not saved
    assert math.isclose(best["value"], niqe[step - 1], abs_tol=5e-5)
    assert f"Best NIQE on test_footage: {niqe[step - 1]:.4f} at step {step}" in log
    state = torch.load(task / "models" / "2_state.pth", weights_only=True)["best"]
    assert state["metrics"] == best["metrics"] and state["step"] == step
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    (events,) = [os.path.join(task / "tensorboard", f) for f in os.listdir(task / "tensorboard")]
    acc = EventAccumulator(events)
    acc.Reload()
    assert {"val/PSNR", "val_footage/NIQE"} <= set(acc.Tags()["scalars"]) and "val/NIQE" not in acc.Tags()["scalars"]
    assert [round(e.value, 4) for e in acc.Scalars("val_footage/NIQE")] == [round(v, 4) for v in niqe]
    assert {"val/lq_output_gt", "val_footage/lq_output_gt"} <= set(acc.Tags()["images"])


def test_the_realworld_demo_validates_on_footage_without_gt_with_niqe(tmp_path, one_process) -> None:
    """The real-world demo's ``test_footage``: LQ video files only, written on first use into the folder it names
    (one 48 x 96 H.264 clip, so the x2 output holds NIQE's two 96 x 96 blocks), scored with NIQE at every
    validation beside KAIR's four on the synthetic GT set (which is too small for NIQE: left out there, one
    warning). The demo as shipped, cut to one step on one small training video and one GT clip."""
    demo = os.path.join(ROOT, "options", "vrt", "000_train_vrt_realworld_demo.json")
    opt = parse_options(demo)
    footage = opt["datasets"]["test_footage"]
    assert footage["dataset_type"] == "VideoFileTestDataset" and not footage["dataroot_gt"]
    assert footage["synthesize_if_missing"]["root"] == footage["dataroot_lq"]
    assert opt["val"]["metrics"] == ["psnr", "ssim", "psnr_y", "ssim_y", "niqe"]
    small = {"root": "trainsets/realworld_demo_videos", "num_videos": 1, "num_frames": 4, "size": [80, 80]}
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        assert main_train_vrt.main(["--opt", demo, "--set", "train.total_iter=1", "train.checkpoint_test=1",
                                    "train.checkpoint_save=1", "train.allow_no_adversarial_steps=true",
                                    "datasets.test.num_clips=1",
                                    f"datasets.train.synthesize_if_missing={json.dumps(small)}"]) == 0
    finally:
        os.chdir(cwd)
        logging.getLogger().handlers.clear()
    assert os.listdir(tmp_path / footage["dataroot_lq"]) == ["synthetic_000.mp4"]
    log = (tmp_path / "experiments" / opt["task"] / "train.log").read_text()
    assert re.search(r"Average PSNR: [\d.]+ dB; SSIM: [\d.]+; PSNR_Y: [\d.]+ dB; SSIM_Y: [\d.]+$", log, re.M)
    assert log.count("val.metrics: niqe is left out on datasets.test (") == 1
    assert "Validation on datasets.test_footage (1 clip):" in log
    niqe = re.findall(r"Testing synthetic_000\s+\( 0/1\) \+ NIQE: ([\d.]+)$", log, re.M)
    assert len(niqe) == 1 and math.isfinite(float(niqe[0])) and f"Average NIQE: {niqe[0]}" in log
