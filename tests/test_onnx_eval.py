"""``main_test_vrt.py --onnx``: ONNX Runtime runs the exported network inside the same streaming, tiling, sharding,
resume and metrics as the PyTorch path. A tiny VRT denoiser (noise-level map input, a graph with fixed height and
width) restores a clip folder and a video file: per-clip PSNR within 0.01 dB and every frame within 1 grey level of
the PyTorch evaluation, in one process and shared over two torchrun processes; the video is also scored with VMAF
(a per-clip metric pooled over segments restored by different processes), the same in one and two processes."""

from __future__ import annotations

import copy
import csv
import json
import logging
import sys
from collections import defaultdict

import numpy as np
import pytest
import torch

from data.dataset_video_file import write_video
from engine import evaluate
from models.select_network import define_G
from scripts import export
from tests.support.helpers import ROOT, TORCHRUN_ENTRY, VRT_TINY_OPT, assert_ok, base_env, run
from utils.utils_image import imread_rgb, imwrite_rgb

pytest.importorskip("onnx")  # the optional export extra (requirements-dev.txt installs it)
pytest.importorskip("onnxruntime")

EVAL_ENTRY = f"{ROOT}/tests/support/eval_entry.py"
TILE = ["--tile", "2", "40", "40", "--tile_overlap", "1", "20", "20"]


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    """A tiny VRT denoiser's option file and weights, its ONNX export (tiles of 2 x 40 x 40), two noisy clip folders
    (3 and 4 frames) and a 5-frame lossless video."""
    tmp = tmp_path_factory.mktemp("onnx_eval")
    opt = copy.deepcopy(VRT_TINY_OPT)
    opt["netG"] = {**opt["netG"], "drop_path_rate": 0.0}
    opt["val"] = {"num_frame_testing": 2, "num_frame_overlapping": 1, "size_patch_testing": 40, "overlap_size": 20}
    opt["path"]["root"] = str(tmp / "experiments")
    (tmp / "opt.json").write_text(json.dumps(opt))
    torch.manual_seed(0)
    (tmp / "experiments" / "vrt" / "models").mkdir(parents=True)
    torch.save({"params": define_G(opt).state_dict()}, tmp / "experiments" / "vrt" / "models" / "5_G.pth")
    gen = torch.Generator().manual_seed(3)
    smooth = torch.nn.functional.interpolate(torch.rand(9, 3, 10, 10, generator=gen), size=(40, 40), mode="bicubic",
                                             align_corners=False).clamp(0, 1)
    for clip, frames in (("a", smooth[:3]), ("b", smooth[3:7])):
        for t, frame in enumerate(frames):
            imwrite_rgb(str(tmp / "gt" / clip / f"{t:08d}.png"), frame)
    write_video(str(tmp / "video" / "walk.avi"), smooth[4:9], fps=25)  # FFV1: lossless
    assert export.main(["--opt", str(tmp / "opt.json"), "--tile", "2", "40", "40", "--out", str(tmp / "vrt.onnx")]) == 0
    return tmp


def _args(ws, kind: str, save: str, onnx: bool) -> list[str]:
    data = {"folders": ["--folder_lq", str(ws / "gt"), "--folder_gt", str(ws / "gt")],
            "video": ["--folder_lq", str(ws / "video" / "walk.avi"), "--folder_gt", str(ws / "video" / "walk.avi"),
                      "--metrics", "psnr", "ssim", "psnr_y", "ssim_y", "vmaf"]}
    return ["--opt", str(ws / "opt.json"), *data[kind], "--sigma", "30", "--save_result", "--num_workers", "0",
            "--segment_frames", "2", "--save_dir", str(ws / save), *(["--onnx", str(ws / "vrt.onnx")] if onnx else [])]


def _clip_psnr(save_dir) -> dict[str, float]:
    per_clip = defaultdict(list)
    with open(save_dir / "metrics.csv") as f:
        for row in csv.DictReader(f):
            per_clip[row["folder"]].append(float(row["psnr"]))
    return {clip: float(np.mean(v)) for clip, v in per_clip.items()}


def _frames(save_dir) -> dict[str, np.ndarray]:
    return {str(p.relative_to(save_dir)): imread_rgb(str(p)).astype(np.int16) for p in sorted(save_dir.rglob("*.png"))
            if ".eval_state" not in p.parts}


def _assert_close(ws, reference: str, other: str) -> None:
    """Per-clip PSNR within 0.01 dB, every frame within 1 grey level, the same frames."""
    ref, out = _clip_psnr(ws / reference), _clip_psnr(ws / other)
    assert ref.keys() == out.keys() and all(abs(ref[c] - out[c]) <= 0.01 for c in ref), (ref, out)
    ref_frames, out_frames = _frames(ws / reference), _frames(ws / other)
    assert ref_frames and ref_frames.keys() == out_frames.keys()
    assert max(int(np.abs(ref_frames[k] - out_frames[k]).max()) for k in ref_frames) <= 1


def test_onnx_evaluation_of_a_clip_folder_equals_pytorch_and_resumes(workspace, one_thread, caplog):
    assert evaluate.main([*_args(workspace, "folders", "folders_torch", onnx=False), "--device", "cpu"]) == 0
    onnx_args = [*_args(workspace, "folders", "folders_onnx", onnx=True), "--device", "cpu"]
    assert evaluate.main(onnx_args) == 0
    _assert_close(workspace, "folders_torch", "folders_onnx")
    # resume: with one segment's marker gone, that segment's frames are redone and nothing else; same metrics
    save = workspace / "folders_onnx"
    markers = sorted(p for p in (save / ".eval_state").rglob("*.json"))
    assert len(markers) >= 3  # clips of 3 and 4 frames in segments of 2
    gone = json.loads(markers[1].read_text())
    metrics = (save / "metrics.csv").read_bytes()
    stamps = {p: p.stat().st_mtime_ns for p in save.rglob("*.png") if ".eval_state" not in p.parts}
    markers[1].unlink()
    caplog.clear()
    with caplog.at_level(logging.INFO):
        assert evaluate.main(onnx_args) == 0
    redone = sorted(str(p.relative_to(save)) for p, t in stamps.items() if p.stat().st_mtime_ns != t)
    assert redone == sorted(f"{gone['folder']}/{name}.png" for name in gone["names"]), (redone, gone)
    assert f"Restored {len(gone['names'])} frames" in caplog.text
    assert f"({len(markers) - 1} complete segments skipped)" in caplog.text
    assert (save / "metrics.csv").read_bytes() == metrics


def test_onnx_evaluation_of_a_video_equals_pytorch_in_one_and_two_processes(workspace, one_thread):
    ws = workspace
    assert evaluate.main([*_args(ws, "video", "video_torch", onnx=False), "--device", "cpu"]) == 0
    assert evaluate.main([*_args(ws, "video", "video_onnx", onnx=True), "--device", "cpu"]) == 0
    _assert_close(ws, "video_torch", "video_onnx")
    cmd = [sys.executable, TORCHRUN_ENTRY, "--standalone", "--nproc_per_node=2", EVAL_ENTRY,
           *_args(ws, "video", "video_onnx2", onnx=True)]
    two = run(cmd, base_env(), str(ws), timeout=240)
    assert_ok(two)
    assert "ONNX Runtime runs" in two.stdout + two.stderr
    _assert_close(ws, "video_torch", "video_onnx2")
    # the two processes shared the segments and give what one process gives, bit for bit
    one, both = _frames(ws / "video_onnx"), _frames(ws / "video_onnx2")
    assert len(one) == 5 and all(np.array_equal(one[k], both[k]) for k in one)
    for name in ("metrics.csv", "clips.csv"):  # VMAF included: its clip pooled over segments of both processes
        assert (ws / "video_onnx" / name).read_bytes() == (ws / "video_onnx2" / name).read_bytes(), name
    assert "vmaf" in (ws / "video_onnx2" / "clips.csv").read_text().splitlines()[0]
    markers = [json.loads(p.read_text()) for p in (ws / "video_onnx2" / ".eval_state").rglob("*.json")
               if p.name not in ("video.json", "vmaf.json")]
    assert {m["rank"] for m in markers} == {0, 1}


def test_a_tile_the_graph_was_not_built_for_is_one_error_line(workspace, caplog):
    args = [*_args(workspace, "folders", "bad", onnx=True), "--device", "cpu", "--tile", "3", "40", "40"]
    assert evaluate.main(args) == 2  # clips of 3 and 4 frames give 3-frame tiles; the graph runs 2 frames
    lines = [r.getMessage() for r in caplog.records if "exported for tiles of 2 x 40 x 40" in r.getMessage()]
    assert lines and "this tile has 3 frames" in lines[0] and "\n" not in lines[0]
    assert not (workspace / "bad" / "metrics.csv").exists()


def test_a_clip_shorter_than_the_graphs_frames_is_refused_at_start_up(workspace, caplog):
    """PyTorch runs a clip shorter than the temporal tile as one shorter tile; a graph's frames are fixed."""
    short = workspace / "short"
    for clip, count in (("long", 2), ("one", 1)):
        for t in range(count):
            imwrite_rgb(str(short / clip / f"{t:08d}.png"), imread_rgb(str(workspace / "gt" / "a" / f"{t:08d}.png")))
    args = ["--opt", str(workspace / "opt.json"), "--folder_lq", str(short), "--sigma", "30", "--num_workers", "0",
            "--save_dir", str(workspace / "short_out"), "--onnx", str(workspace / "vrt.onnx"), "--device", "cpu"]
    assert evaluate.main(args) == 2
    (line,) = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert "clip one has 1 frames" in line and "fewer than the 2 frames" in line and "--tile 1 40 40" in line
    assert "\n" not in line and not (workspace / "short_out" / "one").exists()
