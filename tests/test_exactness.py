"""Exactness on the real networks, with real processes at 2 intra-op threads: the same command twice, resumes,
elastic restarts, preemption through the launcher and crashes inside the real checkpoint write all end with the
weights, EMA, optimizer state and logged losses of an uninterrupted run, bit for bit."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest

from tests.support.helpers import (
    ROOT,
    RVRT_TINY_OPT,
    VRT_TINY_OPT,
    assert_ok,
    assert_same_run,
    base_env,
    models_dir,
    single,
    torchrun,
    write_opt,
)
from utils.utils_checkpoint import complete_steps
from utils.utils_numerics import cpu_has_native_bf16


def _run(tmp_path, opt, task, *sets, threads=2, nproc=1, extra=None, **env):
    root = os.path.join(tmp_path, "experiments")
    args = ["--opt", opt, "--set", f"task={task}", f"path.root={root}", *sets]
    environment = base_env(threads=threads, **env)
    if nproc == 1:
        return single(args, environment, str(tmp_path))
    return torchrun(nproc, args, environment, str(tmp_path), extra=extra)


# ----------------------------------------------------------------------------------------------------------------
# the same command twice
# ----------------------------------------------------------------------------------------------------------------
# The two `slow` cases add nothing the other two lack on a 2-core CI machine (default threads = 2; 2 workers vs 1):
# they are for bigger machines (`-m slow`).
@pytest.mark.parametrize("threads, workers, nproc", [
    pytest.param(1, 0, 1, id="1thread-0workers-1proc"),
    pytest.param(2, 2, 1, id="2threads-2workers-1proc", marks=pytest.mark.slow),
    pytest.param(2, 1, 2, id="2threads-1worker-2procs"),
    pytest.param(None, 2, 2, id="default-threads-2workers-2procs", marks=pytest.mark.slow)])
def test_the_same_command_twice_is_bit_identical(tmp_path, threads, workers, nproc):
    opt = write_opt(tmp_path, base=VRT_TINY_OPT, train={"total_iter": 4, "checkpoint_save": 4, "grad_accum_steps": 1},
                    datasets={"train": {"dataloader_num_workers": workers}})
    for task in ("a", "b"):
        assert_ok(_run(tmp_path, opt, task, threads=threads, nproc=nproc))
    assert_same_run(tmp_path, "a", "b", 4)


# ----------------------------------------------------------------------------------------------------------------
# resume: VRT (EMA, accumulation 2, stochastic depth, fix_iter 4 crossed after the stop) and RVRT (bf16 where native)
# ----------------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def vrt_reference(tmp_path_factory):
    """An uninterrupted 6-step VRT run (1 process, 2 threads) that the interrupted runs are compared with."""
    tmp_path = tmp_path_factory.mktemp("vrt")
    opt = write_opt(tmp_path, base=VRT_TINY_OPT)
    assert_ok(_run(tmp_path, opt, "ref"))
    return tmp_path, opt


def _copy_reference_log(ref_path, tmp_path, task):
    """Put the reference experiment beside the test's so the comparison helpers find both."""
    dest = os.path.join(tmp_path, "experiments", "ref")
    if not os.path.isdir(dest):
        shutil.copytree(os.path.join(ref_path, "experiments", "ref"), dest)


def test_vrt_resume_across_fix_iter_is_bit_identical(vrt_reference, tmp_path):
    ref_path, opt = vrt_reference
    first = _run(tmp_path, opt, "part", "train.total_iter=2")
    assert_ok(first)
    assert complete_steps(models_dir(tmp_path, "part")) == [2]
    again = _run(tmp_path, opt, "part")
    assert_ok(again)
    assert "Resuming from step 2" in again.stdout and "not bit-exact" not in again.stdout
    assert "at step 3" in again.stdout.split("Freeze")[1] and "Unfreeze" in again.stdout  # fix_iter 4 crossed
    _copy_reference_log(ref_path, tmp_path, "part")
    assert_same_run(tmp_path, "ref", "part", 6)


def test_rvrt_resume_is_bit_identical(tmp_path):
    # One clip a step and no accumulation (the VRT case above has it). bf16 where the CPU multiplies it natively:
    # elsewhere it is emulated, 30-60x slower (RESULTS.md), and bf16 resumes are shown in process there
    # (test_model_gan.py::test_bf16_accumulated_gan_run..., test_network_basicvsrpp.py::test_bf16_accumulated...).
    amp = "bf16" if cpu_has_native_bf16() else "none"
    opt = write_opt(tmp_path, base=RVRT_TINY_OPT, datasets={"train": {"dataloader_batch_size": 1}},
                    train={"total_iter": 3, "fix_iter": 3, "grad_accum_steps": 1, "checkpoint_save": 1, "amp": amp})
    assert_ok(_run(tmp_path, opt, "ref"))
    assert_ok(_run(tmp_path, opt, "part", "train.total_iter=1"))
    again = _run(tmp_path, opt, "part")
    assert_ok(again)
    assert "Resuming from step 1" in again.stdout and "Unfreeze" in again.stdout
    assert_same_run(tmp_path, "ref", "part", 3)


def test_sigterm_saves_the_current_step_and_the_rerun_continues_exactly(vrt_reference, tmp_path):
    ref_path, opt = vrt_reference
    stopped = _run(tmp_path, opt, "term", TEST_SIGNAL_AT_STEP="3", TEST_SIGNAL="SIGTERM")
    assert_ok(stopped)
    assert "Stopped by SIGTERM at step 3: checkpoint saved" in stopped.stdout
    assert complete_steps(models_dir(tmp_path, "term")) == [2, 3]
    assert_ok(_run(tmp_path, opt, "term"))
    _copy_reference_log(ref_path, tmp_path, "term")
    assert_same_run(tmp_path, "ref", "term", 6)


def test_crashes_inside_the_real_checkpoint_write_resume_the_previous_complete_step(vrt_reference, tmp_path):
    """SIGKILL during torch.save of 4_G, between 4_G and 4_E, after the fsync of 4_state before its os.replace,
    and during torch.save of 6_optimizerG: each time the newest complete checkpoint is the one resumed."""
    ref_path, opt = vrt_reference
    models = models_dir(tmp_path, "crash")
    for crash, resumed_from, complete in (("4:G:write", 0, [2]), ("4:E:before", 2, [2]),
                                          ("4:state:replace", 2, [2]), ("6:optimizerG:write", 2, [2, 4])):
        proc = _run(tmp_path, opt, "crash", TEST_CRASH_IN_SAVE=crash)
        assert proc.returncode == -signal.SIGKILL, (crash, proc.returncode, proc.stderr[-2000:])
        assert complete_steps(models) == complete, (crash, sorted(os.listdir(models)))
        resumed = re.search(r"Resuming from step (\d+)", proc.stdout)
        assert (int(resumed.group(1)) if resumed else 0) == resumed_from, crash
    final = _run(tmp_path, opt, "crash")
    assert_ok(final)
    assert "Resuming from step 4" in final.stdout
    assert not [f for f in os.listdir(models) if ".tmp" in f]  # the temporaries of the killed saves are gone
    _copy_reference_log(ref_path, tmp_path, "crash")
    assert_same_run(tmp_path, "ref", "crash", 6)


# ----------------------------------------------------------------------------------------------------------------
# two processes: elastic restart after SIGKILL, and preemption through the launcher
# ----------------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def vrt_two_process_reference(tmp_path_factory):
    """An uninterrupted 4-step VRT run on 2 processes (2 threads each, 1 loader worker each)."""
    tmp_path = tmp_path_factory.mktemp("vrt2")
    opt = write_opt(tmp_path, base=VRT_TINY_OPT, train={"total_iter": 4, "grad_accum_steps": 1},
                    datasets={"train": {"dataloader_num_workers": 2}})
    assert_ok(_run(tmp_path, opt, "ref", nproc=2))
    return tmp_path, opt


def test_elastic_restart_after_sigkill_is_bit_identical(vrt_two_process_reference, tmp_path):
    ref_path, opt = vrt_two_process_reference
    proc = _run(tmp_path, opt, "killed", nproc=2, extra=["--max-restarts=2"], TEST_KILL_AT_STEP="3",
                TEST_KILL_RANK="1")
    assert_ok(proc)
    assert "Resuming from step 2" in proc.stdout + proc.stderr
    _copy_reference_log(ref_path, tmp_path, "killed")
    assert_same_run(tmp_path, "ref", "killed", 4)


def _terminal_signals() -> None:
    for sig in (signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)


def _launch(tmp_path, opt, task, sig, target, nproc, at_step=2, timeout=300):
    """``bash launch_train.sh OPT`` as a terminal job; once the log shows step ``at_step``, send ``sig`` to the
    launcher (``target='agent'``: SLURM's --signal to the batch step) or to its process group (``'group'``: Ctrl-C or
    a hang-up in the terminal, ``timeout``, ``kill -TERM -- -PGID``; with one process the loader workers get it
    too)."""
    env = base_env(threads=2, NPROC=str(nproc))
    root = os.path.join(tmp_path, "experiments")
    cmd = ["bash", os.path.join(ROOT, "launch_train.sh"), opt, "--set", f"task={task}", f"path.root={root}"]
    # a terminal's job takes Ctrl-C and hang-ups by default, even where pytest itself was started in the background
    # (a non-interactive shell starts background jobs with SIGINT ignored, and an ignored signal stays ignored)
    proc = subprocess.Popen(cmd, env=env, cwd=str(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True, preexec_fn=_terminal_signals)
    log = os.path.join(tmp_path, "experiments", task, "train.log")
    deadline = time.monotonic() + timeout
    sent = False
    while proc.poll() is None and time.monotonic() < deadline:
        if not sent and os.path.isfile(log) and f"iter:{at_step:8,d}" in open(log).read():
            os.killpg(proc.pid, sig) if target == "group" else os.kill(proc.pid, sig)
            sent = True
        time.sleep(0.1)
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    out = proc.communicate()[0]
    assert sent, f"step {at_step} never logged:\n{out[-3000:]}"
    return proc.returncode, out


@pytest.mark.parametrize("sig, target, nproc", [
    pytest.param(signal.SIGTERM, "agent", 2, id="SIGTERM-to-torchrun"),
    # the agent forwards SIGUSR1 through the same handler as SIGTERM (tests/test_slurm.py sends it to a worker)
    pytest.param(signal.SIGUSR1, "agent", 2, id="SIGUSR1-to-torchrun", marks=pytest.mark.slow),
    # every process of the job at once, loader workers included (timeout, kill -TERM -- -PGID, scancel, systemd)
    pytest.param(signal.SIGTERM, "group", 1, id="SIGTERM-to-the-group-single"),
    # a terminal's hang-up reaches torchrun's agent with the rest of the group; the agent forwards it
    pytest.param(signal.SIGHUP, "group", 2, id="hangup-to-the-group-torchrun"),
    # the same forwarding as the hang-up above, from Ctrl-C
    pytest.param(signal.SIGINT, "group", 2, id="ctrl-c-torchrun", marks=pytest.mark.slow),
    pytest.param(signal.SIGINT, "group", 1, id="ctrl-c-single")])
def test_preemption_through_the_launcher_saves_and_exits_zero(vrt_two_process_reference, tmp_path, sig, target,
                                                              nproc):
    ref_path, opt = vrt_two_process_reference
    code, out = _launch(tmp_path, opt, "pre", sig, target, nproc)
    assert code == 0, out[-3000:]
    stopped = re.search(rf"Stopped by {sig.name} at step (\d+): checkpoint saved", out)
    assert stopped, out[-3000:]
    assert complete_steps(models_dir(tmp_path, "pre"))[-1] == int(stopped.group(1))
    if sig == signal.SIGTERM and nproc == 2:  # the re-run through the launcher continues exactly
        root = os.path.join(tmp_path, "experiments")
        proc = subprocess.run(["bash", os.path.join(ROOT, "launch_train.sh"), opt, "--set", "task=pre",
                               f"path.root={root}"],
                              env=base_env(threads=2, NPROC="2"), cwd=str(tmp_path), capture_output=True, text=True,
                              timeout=300)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        _copy_reference_log(ref_path, tmp_path, "pre")
        assert_same_run(tmp_path, "ref", "pre", 4)


def test_the_reference_fixture_ran_at_two_threads(vrt_reference):
    """Guard against a harness change that would silently test at one thread."""
    ref_path, _ = vrt_reference
    log = open(os.path.join(ref_path, "experiments", "ref", "train.log")).read()
    assert "2 intra-op thread(s)" in log and "deterministic on" in log
    assert sys.platform.startswith("linux")


# ----------------------------------------------------------------------------------------------------------------
# IART: the same command twice, SIGTERM then resume across the SpyNet switch point, 2 processes == 1 accumulating
# ----------------------------------------------------------------------------------------------------------------
# A tiny x4 IART (implicit alignment, SpyNet, checkpointed Swin blocks) with EMA, 2 micro-batches of 1 clip per step
# and its recipes' SpyNet phase (frozen, then trained at lr x 0.125) switching at step 3, the tiny scale of the
# official 5,000 (a run stopped at step 1 crosses it after its resume); bf16 where the CPU multiplies it natively
# (as the recipes recommend). Stochastic depth is off so that one uninterrupted run is the reference of all three
# cases: its per-rank random streams follow the number of processes by design (tests/test_elastic.py).
IART_TINY_OPT = {
    **VRT_TINY_OPT, "task": "iart", "scale": 4,
    "netG": {"net_type": "iart", "mid_channels": 8, "embed_dim": 8, "depths": [1], "num_heads": [2],
             "window_size": [3, 4, 4], "use_checkpoint": [True, False, False, True], "drop_path_rate": 0.0,
             "spynet_path": None},
    "datasets": {"train": {**VRT_TINY_OPT["datasets"]["train"], "task": "sr", "gt_size": 256, "num_clips": 5,
                           "dataloader_num_workers": 0}},
    "train": {**VRT_TINY_OPT["train"], "fix_iter": 3, "fix_keys": ["spynet"], "fix_lr_mul": 0.125, "total_iter": 3,
              "checkpoint_save": 3, "amp": "bf16" if cpu_has_native_bf16() else "none"},
}


@pytest.fixture(scope="module")
def iart_reference(tmp_path_factory):
    """An uninterrupted 3-step IART run (1 process, 2 threads, 2 micro-batches a step)."""
    tmp_path = tmp_path_factory.mktemp("iart")
    opt = write_opt(tmp_path, base=IART_TINY_OPT)
    assert_ok(_run(tmp_path, opt, "ref"))
    return tmp_path, opt


def test_iart_same_command_twice_is_bit_identical(iart_reference, tmp_path):
    ref_path, opt = iart_reference
    assert_ok(_run(tmp_path, opt, "again"))
    _copy_reference_log(ref_path, tmp_path, "again")
    assert_same_run(tmp_path, "ref", "again", 3)


def test_iart_sigterm_then_resume_across_the_spynet_switch_is_bit_identical(iart_reference, tmp_path):
    ref_path, opt = iart_reference
    stopped = _run(tmp_path, opt, "term", TEST_SIGNAL_AT_STEP="1", TEST_SIGNAL="SIGTERM")
    assert_ok(stopped)
    assert "Stopped by SIGTERM at step 1: checkpoint saved" in stopped.stdout
    assert complete_steps(models_dir(tmp_path, "term")) == [1]
    again = _run(tmp_path, opt, "term")
    assert_ok(again)
    resumed = again.stdout.split("Resuming from step 1")[1]
    assert "at step 2" in resumed.split("Freeze")[1] and "at step 3" in resumed.split("Unfreeze")[1]
    _copy_reference_log(ref_path, tmp_path, "term")
    assert_same_run(tmp_path, "ref", "term", 3)


def test_iart_two_processes_equal_one_accumulating(iart_reference, tmp_path):
    """2 processes of 1 clip each against 1 process accumulating 2 micro-batches: DDP averages ``(g0 + g1) / 2``,
    accumulation sums ``g0 / 2 + g1 / 2``: the same bits (the SpyNet phase change re-wraps DDP at step 3)."""
    ref_path, opt = iart_reference
    proc = _run(tmp_path, opt, "ddp", "train.grad_accum_steps=1", nproc=2)
    assert_ok(proc)
    log = open(os.path.join(tmp_path, "experiments", "ddp", "train.log")).read()
    assert "Global batch 2 = 1 per process x 2 process(es) x 1 accumulation step(s)" in log
    _copy_reference_log(ref_path, tmp_path, "ddp")
    assert_same_run(tmp_path, "ref", "ddp", 3)


# ----------------------------------------------------------------------------------------------------------------
# BasicVSR++: 2 processes == 1 accumulating, with its CPU training head (one frame at a time: the weight gradients
# are sums over frames, whose order the processes must not change)
# ----------------------------------------------------------------------------------------------------------------
# A tiny x4 BasicVSR++ (SpyNet, second-order deformable alignment) with EMA, 2 micro-batches of 1 clip of 3 frames a
# step, SpyNet frozen for step 1 then trained at lr x 0.25 (the recipes' keys), so DDP is re-wrapped once.
BASICVSRPP_TINY_OPT = {
    **VRT_TINY_OPT, "task": "basicvsrpp", "scale": 4,
    "netG": {"net_type": "basicvsrpp", "mid_channels": 8, "num_blocks": 1, "spynet_path": None},
    "datasets": {"train": {**VRT_TINY_OPT["datasets"]["train"], "task": "sr", "gt_size": 144, "num_frame": 3,
                           "dataloader_num_workers": 0}},
    "train": {**VRT_TINY_OPT["train"], "fix_iter": 2, "fix_keys": ["spynet"], "fix_lr_mul": 0.25, "total_iter": 2,
              "checkpoint_save": 2},
}


def test_basicvsrpp_two_processes_equal_one_accumulating(tmp_path):
    opt = write_opt(tmp_path, base=BASICVSRPP_TINY_OPT)
    assert_ok(_run(tmp_path, opt, "ref"))
    proc = _run(tmp_path, opt, "ddp", "train.grad_accum_steps=1", nproc=2)
    assert_ok(proc)
    log = open(os.path.join(tmp_path, "experiments", "ddp", "train.log")).read()
    assert "Global batch 2 = 1 per process x 2 process(es) x 1 accumulation step(s)" in log
    assert "Unfreeze" in proc.stdout
    assert_same_run(tmp_path, "ref", "ddp", 2)
