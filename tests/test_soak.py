"""Soak test (marked slow, not in CI): 2 processes train the demo while workers are killed at random intervals;
the final weights must equal an uninterrupted run's.

    SOAK_SECONDS=1800 python -m pytest -q -m slow tests/test_soak.py
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
import threading
import time

import pytest
import torch

from tests.support.helpers import DIST_ENTRY, ROOT, base_env, load_params
from utils.utils_checkpoint import complete_steps

DEMO = os.path.join(ROOT, "options", "vrt", "000_train_vrt_demo.json")


def _workers(agent_pid: int) -> list[int]:
    """The training worker processes torchrun's agent started."""
    out = subprocess.run(["ps", "-o", "pid=,args=", "--ppid", str(agent_pid)], capture_output=True, text=True).stdout
    return [int(line.split()[0]) for line in out.splitlines() if "dist_entry" in line]


def _prune(models: str, keep: int) -> None:
    """Remove the files of all but the newest ``keep`` complete steps (what a user with a small disk would do)."""
    for step in complete_steps(models)[:-keep] if os.path.isdir(models) else []:
        for suffix in ("state", "G", "E", "optimizerG"):  # state first: the step is incomplete from then on
            path = os.path.join(models, f"{step}_{suffix}.pth")
            if os.path.exists(path):
                os.remove(path)


def _launch(args: list[str], env: dict[str, str], cwd: str, log: str | None = None) -> subprocess.Popen:
    """torchrun with 2 processes on the demo; output to a pipe, or to the file ``log`` (a run nobody reads live)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "--max-restarts=1000",
           DIST_ENTRY, "--opt", DEMO, *args]
    out = open(log, "w") if log else subprocess.PIPE  # noqa: SIM115 (the child owns it)
    return subprocess.Popen(cmd, env=env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, text=True)


def _seconds_per_step(sets: list[str], cwd: str) -> float:
    """Training seconds per step of the demo with 2 processes (start-up excluded)."""
    probe = _launch([*sets, "task=probe", "train.total_iter=30", "train.checkpoint_print=1"], base_env(), cwd)
    stamps = [time.monotonic() for line in probe.stdout if "iter:" in line]
    assert probe.wait() == 0 and len(stamps) >= 20, "the probe run failed"
    return (stamps[-1] - stamps[4]) / (len(stamps) - 5)


@pytest.mark.slow
def test_soak_random_kills(tmp_path):
    """The killed run lasts about SOAK_SECONDS; the uninterrupted reference runs beside it at the same time."""
    budget = float(os.environ.get("SOAK_SECONDS", 1800))
    rng = random.Random(int(os.environ.get("SOAK_SEED", 0)))
    sets = ["--set", "train.checkpoint_save=5", "train.checkpoint_test=0", "train.checkpoint_print=10"]
    start = time.monotonic()
    per_step = _seconds_per_step(sets, str(tmp_path))
    # Both runs share the 2 cores until the reference ends, and restarts cost time: ~0.45 of the budget alone.
    steps = max(12, int(0.45 * budget / per_step))
    common = [*sets, f"train.total_iter={steps}", f"train.G_scheduler_periods={steps}"]
    ref_log = str(tmp_path / "ref.log")
    ref = _launch([*common, "task=ref"], base_env(), str(tmp_path), log=ref_log)
    soak_start = time.monotonic()
    soak = _launch([*common, "task=soak"], base_env(), str(tmp_path))
    kills: list[float] = []
    stop = threading.Event()

    def killer() -> None:
        while not stop.wait(rng.uniform(10, 60)):
            for task in ("ref", "soak"):  # ~24 MB per checkpoint of the demo: keep the newest two complete steps
                _prune(str(tmp_path / "experiments" / task / "models"), keep=2)
            workers = _workers(soak.pid)
            if workers:
                os.kill(rng.choice(workers), 9)
                kills.append(time.monotonic() - start)

    thread = threading.Thread(target=killer, daemon=True)
    thread.start()
    out = soak.communicate(timeout=budget * 3)[0]
    soak_wall = time.monotonic() - soak_start
    stop.set()
    thread.join()
    assert ref.wait(timeout=budget * 2) == 0, open(ref_log).read()[-3000:]
    assert soak.returncode == 0, out[-3000:]
    models = tmp_path / "experiments"
    ref_w = load_params(str(models / "ref" / "models" / f"{steps}_G.pth"))
    soak_w = load_params(str(models / "soak" / "models" / f"{steps}_G.pth"))
    identical = all(torch.equal(ref_w[k], soak_w[k]) for k in ref_w)
    summary = (f"soak: {steps} steps, {len(kills)} worker kills, {out.count('Resuming from step')} resumes, "
               f"final weights bit-identical: {identical}, killed run {soak_wall:.0f} s, "
               f"{per_step:.2f} s/step undisturbed")
    print(summary)
    with open(os.path.join(str(tmp_path), "..", "soak_result.txt"), "w") as f:
        f.write(summary + "\n")
    assert kills and "Resuming from step" in out and identical
