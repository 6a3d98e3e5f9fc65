"""Failures with real processes on the toy network: ranks agree on a stop, no hangs, stalled loaders, no unsafe calls.

The recovery promises themselves (resume, elastic restart, preemption, crashes inside a save) are tested on VRT and
RVRT in tests/test_exactness.py."""

from __future__ import annotations

import os
import time

import torch

from tests.support.helpers import ROOT, assert_ok, base_env, load_params, reports, single, torchrun, write_opt
from utils.utils_checkpoint import complete_steps


def _models(tmp_path, task):
    return str(tmp_path / "experiments" / task / "models")


def _same(a: str, b: str) -> bool:
    wa, wb = load_params(a), load_params(b)
    return all(torch.equal(wa[k], wb[k]) for k in wa)


def test_sigusr1_on_one_rank_stops_all_ranks_at_the_same_step(tmp_path):
    opt = write_opt(tmp_path, train={"total_iter": 6, "checkpoint_save": 100})
    report = tmp_path / "rep"
    report.mkdir()
    env = base_env(str(report), TEST_SIGNAL_AT_STEP="2", TEST_SIGNAL="SIGUSR1", TEST_SIGNAL_RANK="1")
    proc = torchrun(2, ["--opt", opt, "--set", "task=usr"], env, str(tmp_path))
    assert_ok(proc)
    assert complete_steps(_models(tmp_path, "usr")) == [2]
    reps = reports(str(report))
    assert len(reps) == 2 and reps[0]["checksum"] == reps[1]["checksum"]


def test_dead_rank_without_restarts_does_not_hang(tmp_path):
    opt = write_opt(tmp_path, train={"total_iter": 50}, dist_timeout=30)
    env = base_env(TEST_KILL_AT_STEP="2", TEST_KILL_RANK="1")
    start = time.monotonic()
    proc = torchrun(2, ["--opt", opt, "--set", "task=dead"], env, str(tmp_path), timeout=120)
    assert proc.returncode != 0
    assert time.monotonic() - start < 90


def test_stalled_loader_is_reported_with_worker_stack(tmp_path):
    opt = write_opt(tmp_path, datasets={"train": {"dataset_type": "SleepyDataset", "dataloader_num_workers": 1}},
                    train={"dataloader_timeout": 3})
    proc = single(["--opt", opt, "--set", "task=stall"], base_env(), str(tmp_path), timeout=120)
    assert proc.returncode == 1
    assert "error: the training data loader produced no batch for 3 s" in proc.stderr
    assert "in __getitem__" in proc.stderr  # the stalled worker's stack, dumped by faulthandler


def test_no_shell_eval_or_unsafe_load_in_project_code():
    import ast

    offenders = []
    for folder in ("models", "data", "utils", "scripts", "benchmarks", "."):
        base = os.path.join(ROOT, folder)
        names = os.listdir(base) if folder == "." else [os.path.relpath(os.path.join(d, f), base)
                                                         for d, _, fs in os.walk(base) for f in fs]
        for name in names:
            path = os.path.join(base, name)
            if not name.endswith(".py") or (folder == "." and os.path.isdir(path)):
                continue
            tree = ast.parse(open(path).read())
            for node in ast.walk(tree):
                if isinstance(node, ast.Call):
                    func = ast.unparse(node.func)
                    kws = {k.arg: ast.unparse(k.value) for k in node.keywords}
                    # benchmarks and scripts/reference may exec the *reference's* source from a checkout the user
                    # names (to import it beside our same-named packages, patched where the CPU needs it); nothing
                    # executes strings that come from options or data
                    reference = folder == "benchmarks" or (folder == "scripts" and name.startswith("reference/"))
                    banned = ("eval", "os.system", "os.popen") + (() if reference else ("exec",))
                    if func in banned or kws.get("shell") == "True":
                        offenders.append(f"{path}:{node.lineno} {func}")
                    if func.endswith("torch.load") and kws.get("weights_only") != "True":
                        offenders.append(f"{path}:{node.lineno} torch.load without weights_only=True")
    assert not offenders, offenders



def test_a_rank_that_did_not_get_the_signal_names_the_one_another_rank_got(monkeypatch):
    """A signal forwarded to each task (SLURM's --signal=B:USR1) may reach rank 0 after the others have stopped: the
    agreement carries the signal, so rank 0's log line names it."""
    import signal

    from engine import preemption

    seen = []

    def other_rank_got_usr1(value: int) -> int:
        seen.append(value)
        return max(value, int(signal.SIGUSR1))

    monkeypatch.setattr(preemption.utils_dist, "all_reduce_max_int", other_rank_got_usr1)
    monkeypatch.delenv(preemption.STOP_ENV, raising=False)
    stop = preemption.StopRequest()
    assert stop.agreed() and stop.stopped_by == "SIGUSR1" and stop.signal_name is None and seen == [0]
    stop.signal_name = "SIGTERM"  # its own signal wins where it has the larger number
    assert stop.agreed() and stop.stopped_by == "SIGTERM"
    monkeypatch.setattr(preemption.utils_dist, "all_reduce_max_int", lambda value: value)
    assert not preemption.StopRequest().agreed()
