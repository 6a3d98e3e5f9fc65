"""End-to-end training with real processes (gloo on the CPU): DDP equivalence, launchers, resume, validation."""

from __future__ import annotations

import os
import re
import subprocess
import sys

from tests.support.helpers import (
    DIST_ENTRY,
    assert_ok,
    base_env,
    free_port,
    load_params,
    max_abs_diff,
    reports,
    single,
    torchrun,
    write_opt,
)

AVG_RE = re.compile(r"Average PSNR: .*")
BASE_RE = re.compile(r"Input baseline .*")


def _models(tmp_path, task="tiny"):
    return str(tmp_path / "experiments" / task / "models")


def test_two_processes_equal_one_process_with_double_batch(tmp_path):
    opt = write_opt(tmp_path, train={"checkpoint_test": 3})
    one, two = tmp_path / "r1", tmp_path / "r2"
    one.mkdir(), two.mkdir()
    proc1 = single(["--opt", opt, "--set", "task=one"], base_env(str(one)), str(tmp_path))
    assert_ok(proc1)
    env = base_env(str(two), CUDA_VISIBLE_DEVICES="7,3")
    proc2 = torchrun(2, ["--opt", opt, "--set", "task=two"], env, str(tmp_path))
    assert_ok(proc2)
    w1 = load_params(os.path.join(_models(tmp_path, "one"), "3_G.pth"))
    w2 = load_params(os.path.join(_models(tmp_path, "two"), "3_G.pth"))
    assert max_abs_diff(w1, w2) <= 1e-6
    reps = reports(str(two))
    assert [r["rank"] for r in reps] == [0, 1] and all(r["rc"] == 0 for r in reps)
    assert all(r["cuda_visible_devices"] == "7,3" for r in reps)  # reaches every process unchanged
    assert reps[0]["checksum"] == reps[1]["checksum"]  # ranks hold identical weights
    for rep in reps:  # the gloo group is gone before interpreter shutdown, where its threads could abort the exit
        assert rep["threads_at_exit"] is None or not [t for t in rep["threads_at_exit"] if "gloo" in t], rep
    exp = str(tmp_path / "experiments")
    assert not [w for w in reps[1]["writes"] if w.startswith(exp)], "rank 1 wrote experiment files"
    assert any(w.startswith(exp) for w in reps[0]["writes"])
    # log format (KAIR) with the loss averaged over ranks and our extra fields
    log = open(tmp_path / "experiments" / "two" / "train.log").read()
    assert re.search(r"<epoch:  0, iter:       3, lr:\d\.\d{3}e-\d\d> G_loss: \d\.\d{3}e[-+]\d\d sec_iter: ", log)
    assert "samples_s:" in log and "peak_mem_GB:" in log
    assert "Global batch 2 = 1 per process x 2 process(es)" in log
    assert re.search(r"Testing clip_\S+\s+\( 2/3\) - PSNR: \d+\.\d\d dB; SSIM: 0\.\d{4}; PSNR_Y", log)


def test_validation_on_two_processes_equals_one(tmp_path):
    opt = write_opt(tmp_path, train={"checkpoint_test": 2, "total_iter": 2, "G_optimizer_lr": 0.0})
    p1 = single(["--opt", opt, "--set", "task=v1"], base_env(), str(tmp_path))
    p2 = torchrun(2, ["--opt", opt, "--set", "task=v2"], base_env(), str(tmp_path))
    assert_ok(p1), assert_ok(p2)
    lines1, lines2 = AVG_RE.findall(p1.stdout), AVG_RE.findall(p2.stdout)
    assert len(lines1) == 1 and lines1 == lines2  # the model, 3 clips over 2 ranks
    base1, base2 = BASE_RE.findall(p1.stdout), BASE_RE.findall(p2.stdout)
    assert len(base1) == 1 and base1 == base2  # the input baseline, in a line of its own


def test_legacy_torch_distributed_launch(tmp_path):
    opt = write_opt(tmp_path, train={"total_iter": 2})
    cmd = [sys.executable, "-m", "torch.distributed.launch", "--nproc_per_node=2", f"--master_port={free_port()}",
           DIST_ENTRY, "--opt", opt, "--dist", "True"]
    proc = subprocess.run(cmd, env=base_env(), cwd=str(tmp_path), capture_output=True, text=True, timeout=240)
    assert_ok(proc)
    assert os.path.isfile(os.path.join(_models(tmp_path), "2_state.pth"))


def test_two_nodes_emulated(tmp_path):
    opt = write_opt(tmp_path, train={"total_iter": 2})
    port = free_port()
    report = tmp_path / "rep"
    report.mkdir()
    procs = []
    for node in (0, 1):
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", f"--node_rank={node}",
               "--nproc_per_node=1", "--master_addr=127.0.0.1", f"--master_port={port}",
               DIST_ENTRY, "--opt", opt]
        procs.append(subprocess.Popen(cmd, env=base_env(str(report)), cwd=str(tmp_path), stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    outs = [p.communicate(timeout=240)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    reps = reports(str(report))
    assert len(reps) == 2 and reps[0]["checksum"] == reps[1]["checksum"]
    assert "Global batch 2 = 1 per process x 2 process(es)" in outs[0]
