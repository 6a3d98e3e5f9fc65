"""What a newcomer reads: the console of a run, KAIR's log lines and the input baseline, one-line errors of
``main_test_vrt.py`` and warnings during its progress bar (issue 25, items 4 and 5)."""

from __future__ import annotations

import io
import logging
import os
import re
import subprocess
import sys

import pytest
import torch

import main_train_vrt
from engine import evaluate
from models.network_baseline import VideoConvBaseline
from tests.support.helpers import ROOT, TINY_OPT, base_env, write_opt
from utils.utils_image import imwrite_rgb

# what KAIR's log parsers match: the average line and the per-clip lines
KAIR_AVERAGE = re.compile(r"Average PSNR: ([\d.]+) dB")
KAIR_CLIP = re.compile(r"- PSNR: ([\d.]+) dB")
BASELINE = re.compile(r"Input baseline \(.*\): PSNR ([\d.]+) dB; SSIM [\d.]+; PSNR_Y [\d.]+ dB; SSIM_Y [\d.]+$", re.M)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """One short run with a validation at its last step (3 test clips), its console output and its log."""
    tmp = tmp_path_factory.mktemp("newcomer")
    opt = write_opt(tmp, train={"total_iter": 2, "checkpoint_test": 2, "checkpoint_save": 2})
    cwd = os.getcwd()
    os.chdir(tmp)
    out = io.StringIO()
    stdout, sys.stdout = sys.stdout, out  # the console handler writes to the sys.stdout it finds at set-up
    try:
        assert main_train_vrt.main(["--opt", opt]) == 0
    finally:
        sys.stdout = stdout
        os.chdir(cwd)
        logging.getLogger().handlers.clear()
    log = (tmp / "experiments" / "tiny" / "train.log").read_text()
    return {"tmp": tmp, "console": out.getvalue(), "log": log, "opt": opt}


def test_kair_parsers_read_the_model_only_and_the_baseline_has_its_own_line(trained):
    log = trained["log"]
    averages = KAIR_AVERAGE.findall(log)
    assert len(averages) == 1, averages  # the model's line; the baseline is not in KAIR's format
    assert len(KAIR_CLIP.findall(log)) == 3  # one per test clip, the model's
    baseline = BASELINE.findall(log)
    assert len(baseline) == 1 and baseline[0] != averages[0]
    assert re.search(r"<epoch:  0, iter:       2> Average PSNR: [\d.]+ dB; SSIM: 0\.\d{4}; PSNR_Y: [\d.]+ dB; "
                     r"SSIM_Y: 0\.\d{4}$", log, re.M)  # KAIR's line, byte for byte in its format


def test_console_shows_a_summary_and_the_log_keeps_the_options(trained):
    console, log = trained["console"], trained["log"]
    # the console: a few lines to read, no options block and no compatibility note
    assert "Options:" not in console and "netG:[" not in console
    assert "Accepted for compatibility" not in console
    assert re.search(r"Task tiny: videoconvbaseline \([\d.]+M parameters\), x4, input 3 \(RGB\) channels", console)
    assert "Data: datasets.train = SyntheticVideoTrainDataset, 64 clip(s)" in console
    assert re.search(r"Steps: 2 \(validation every 2, checkpoint every 2\); log: .*train\.log", console)
    assert len(console.splitlines()) < 25, console
    # train.log keeps everything
    assert "Options:" in log and "netG:[" in log
    assert "Accepted for compatibility, without effect here: gpu_ids" in log


def test_main_test_vrt_error_is_one_line_for_our_option_files(tmp_path):
    opt = write_opt(tmp_path)  # TINY_OPT sets KAIR's gpu_ids and dist
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "main_test_vrt.py"), "--opt", opt, "--folder_lq",
                           str(tmp_path / "missing"), "--device", "cpu"], cwd=str(tmp_path), env=base_env(),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    lines = [line for line in (proc.stdout + proc.stderr).splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), lines


def test_a_warning_during_the_progress_bar_gets_a_line_of_its_own(tmp_path, monkeypatch):
    """Terminal users see the bar and the log in one stream: a warning must not be glued to the bar's line."""
    torch.manual_seed(0)
    net = VideoConvBaseline(**{k: v for k, v in TINY_OPT["netG"].items() if k != "net_type"})
    ckpt = tmp_path / "G.pth"
    torch.save({"params": net.state_dict()}, ckpt)
    for t in range(3):
        imwrite_rgb(str(tmp_path / "lq" / "clip" / f"{t:08d}.png"), torch.rand(3, 16, 16))
    opt = write_opt(tmp_path)
    real_write = evaluate.imwrite_rgb

    def write_and_warn(path, frame):
        logging.getLogger("engine.evaluate").warning("WARN-MARK %s", os.path.basename(path))
        real_write(path, frame)

    monkeypatch.setattr(evaluate, "imwrite_rgb", write_and_warn)
    stream = io.StringIO()
    monkeypatch.setattr(sys, "stdout", stream)
    monkeypatch.setattr(sys, "stderr", stream)
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    root.handlers = [logging.StreamHandler(sys.stdout)]  # as main_test_vrt.py's basicConfig
    root.setLevel(logging.INFO)
    try:
        code = evaluate.main(["--opt", opt, "--model_path", str(ckpt), "--folder_lq", str(tmp_path / "lq"),
                              "--save_dir", str(tmp_path / "out"), "--save_result", "--num_workers", "0",
                              "--device", "cpu", "--segment_frames", "3"])
    finally:
        root.handlers, root.level = handlers, level
    text = stream.getvalue()
    assert code == 0, text
    pieces = re.split(r"[\r\n]", text)
    marks = [p for p in pieces if "WARN-MARK" in p]
    assert len(marks) == 3 and all(p.startswith("WARN-MARK") for p in marks), marks
    assert "frame" in text  # the bar was drawn into the same stream


def _error_line(capsys, args, cwd, monkeypatch) -> str:
    for key in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.chdir(cwd)
    capsys.readouterr()
    code = main_train_vrt.main(args)
    logging.getLogger().handlers.clear()
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and len(err) == 1 and err[0].startswith("error: "), (code, err)
    return err[0]


def test_a_misspelt_data_root_is_an_error_not_synthetic_data(tmp_path, capsys, monkeypatch):
    """The real-world demo writes synthetic videos into its own folder only: a misspelt folder of the user's
    videos is one line naming the key, the path and the nearest existing folder, and nothing is created."""
    (tmp_path / "videos").mkdir()
    typo = tmp_path / "vidoes"
    demo = os.path.join(ROOT, "options", "vrt", "000_train_vrt_realworld_demo.json")
    line = _error_line(capsys, ["--opt", demo, "--set", f"datasets.train.dataroot_gt={typo}"], tmp_path, monkeypatch)
    assert line == (f"error: datasets.train.dataroot_gt = {typo} does not exist (nearest existing folder: "
                    f"{tmp_path / 'videos'})")
    assert sorted(os.listdir(tmp_path)) == ["videos"]  # no synthetic videos, no experiment folder
    # a KAIR recipe without its data stops on the data, before fetching any weights
    rec = os.path.join(ROOT, "options", "vrt", "001_train_vrt_videosr_bi_reds_6frames.json")
    line = _error_line(capsys, ["--opt", rec], tmp_path, monkeypatch)
    assert line.startswith("error: datasets.train.dataroot_gt = trainsets/REDS/")
    assert line.endswith("(nearest existing folder: .)")
    assert sorted(os.listdir(tmp_path)) == ["videos"]


def test_keys_beyond_a_shortened_run_are_named_with_their_effect():
    from engine.options import parse_options
    from engine.schedule_check import schedule_notes

    demo = os.path.join(ROOT, "options", "vrt", "000_train_vrt_realworld_demo.json")
    opt = parse_options(demo, ["train.total_iter=60", "train.allow_no_adversarial_steps=true",
                               "train.checkpoint_test=100", "train.checkpoint_save=61", "train.checkpoint_print=70",
                               "train.fix_iter=80", "train.fix_keys=[\"spynet\"]", "train.G_scheduler_periods=240",
                               "train.D_scheduler_type=MultiStepLR", "train.D_scheduler_milestones=[30, 90]"])
    notes, error = schedule_notes(opt)
    assert error is None
    expected = [
        "train.checkpoint_test = 100 is beyond train.total_iter = 60: no validation runs during this run",
        "train.checkpoint_save = 61 is beyond train.total_iter = 60: only the last step (60) is saved",
        "train.checkpoint_print = 70 is beyond train.total_iter = 60: the only training log line is the last step's",
        "train.fix_iter = 80 is beyond train.total_iter = 60: the parameters of fix_keys ['spynet'] stay frozen",
        # a quarter of the period: (1 + cos(pi / 4)) / 2 = 0.854 of the way is left
        "train.G_scheduler_periods = 240 is beyond train.total_iter = 60: the cosine learning rate falls only 14.6% "
        "of the way to eta_min",
        "train.D_scheduler_milestones [90] are beyond train.total_iter = 60: the learning rate never decays there",
        "train.gan_warmup_iter = 150 reaches train.total_iter = 60: every step trains G on the pixel (and "
        "perceptual) losses alone; D never runs"]
    assert len(notes) == len(expected)
    for note, start in zip(notes, expected):
        assert note.startswith(start), (note, start)
    # nothing to say about the recipe as it is written
    assert schedule_notes(parse_options(demo)) == ([], None)


def test_a_gan_run_that_never_trains_g_adversarially_is_refused(tmp_path, capsys, monkeypatch):
    demo = os.path.join(ROOT, "options", "vrt", "000_train_vrt_realworld_demo.json")
    line = _error_line(capsys, ["--opt", demo, "--set", "train.total_iter=60"], tmp_path, monkeypatch)
    assert line.startswith("error: this GAN run never trains G adversarially: its first adversarial step would be "
                           "151 (train.gan_warmup_iter = 150, train.D_init_iters = 0, train.D_update_ratio = 1) and "
                           "train.total_iter is 60;"), line
    assert "train.allow_no_adversarial_steps=true" in line
    assert os.listdir(tmp_path) == []  # refused before anything is written
    from engine.options import parse_options
    from engine.schedule_check import schedule_notes

    # D_update_ratio: the first step after the warm-up that updates G is the next multiple of the ratio
    opt = parse_options(demo, ["train.total_iter=151", "train.D_update_ratio=2"])
    assert "its first adversarial step would be 152" in schedule_notes(opt)[1]
    assert schedule_notes(parse_options(demo, ["train.total_iter=152", "train.D_update_ratio=2"]))[1] is None


def test_cpu_runs_wait_without_spinning_long_unless_the_user_chose():
    """Spinning OpenMP threads made a run on a busy 2-core machine 10-30x slower (benchmarks/RESULTS.md): the
    entry scripts set a short spin before torch starts its OpenMP runtime, and keep a user's own choice."""
    from utils.utils_openmp import EVAL_SETTINGS, TRAIN_SETTINGS, choose_wait_policy

    env: dict[str, str] = {}
    assert "GOMP_SPINCOUNT=3000" in choose_wait_policy(TRAIN_SETTINGS, env) and env == TRAIN_SETTINGS
    env = {"OMP_WAIT_POLICY": "ACTIVE"}
    assert choose_wait_policy(EVAL_SETTINGS, env).endswith("OMP_WAIT_POLICY=ACTIVE (yours)")
    assert env == {"OMP_WAIT_POLICY": "ACTIVE"}
    with pytest.raises(RuntimeError, match="before torch is imported"):
        choose_wait_policy(TRAIN_SETTINGS)  # torch is loaded here: too late to take effect


def test_the_entry_script_sets_the_wait_policy_before_torch_starts(tmp_path):
    opt = write_opt(tmp_path, train={"total_iter": 1, "checkpoint_save": 1})
    env = {k: v for k, v in base_env().items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME")}
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "main_train_vrt.py"), "--opt", opt], cwd=str(tmp_path),
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "OpenMP waits: GOMP_SPINCOUNT=3000, KMP_BLOCKTIME=1 (set for a CPU shared" in proc.stdout
