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

from tests.helpers import DIST_ENTRY, ROOT, base_env, load_params

DEMO = os.path.join(ROOT, "options", "vrt", "000_train_vrt_demo.json")


def _workers(agent_pid: int) -> list[int]:
    """The training worker processes torchrun's agent started."""
    out = subprocess.run(["ps", "-o", "pid=,args=", "--ppid", str(agent_pid)], capture_output=True, text=True).stdout
    return [int(line.split()[0]) for line in out.splitlines() if "dist_entry" in line]


def _launch(args: list[str], env: dict[str, str], cwd: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "--max-restarts=1000",
           DIST_ENTRY, "--opt", DEMO, *args]
    return subprocess.Popen(cmd, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


@pytest.mark.slow
def test_soak_random_kills(tmp_path):
    budget = float(os.environ.get("SOAK_SECONDS", 1800))
    rng = random.Random(int(os.environ.get("SOAK_SEED", 0)))
    sets = ["--set", "train.checkpoint_save=3", "train.checkpoint_test=0", "train.checkpoint_print=10"]
    # calibrate: how many steps fit in half the budget (the other half is the uninterrupted reference)
    start = time.monotonic()
    probe = _launch([*sets, "task=probe", "train.total_iter=6"], base_env(), str(tmp_path))
    assert probe.wait(timeout=budget) == 0, probe.stdout.read()
    per_step = (time.monotonic() - start) / 6
    steps = max(12, int(budget / 2 / (per_step * 1.6)))  # restarts cost time too
    common = [*sets, f"train.total_iter={steps}", f"train.G_scheduler_periods={steps}"]
    ref = _launch([*common, "task=ref"], base_env(), str(tmp_path))
    ref_out = ref.communicate(timeout=budget * 2)[0]
    assert ref.returncode == 0, ref_out[-3000:]

    soak = _launch([*common, "task=soak"], base_env(), str(tmp_path))
    kills: list[float] = []
    stop = threading.Event()

    def killer() -> None:
        while not stop.wait(rng.uniform(5, 40)):
            workers = _workers(soak.pid)
            if workers:
                os.kill(rng.choice(workers), 9)
                kills.append(time.monotonic() - start)

    thread = threading.Thread(target=killer, daemon=True)
    thread.start()
    out = soak.communicate(timeout=budget * 3)[0]
    stop.set()
    thread.join()
    assert soak.returncode == 0, out[-3000:]
    models = tmp_path / "experiments"
    ref_w = load_params(str(models / "ref" / "models" / f"{steps}_G.pth"))
    soak_w = load_params(str(models / "soak" / "models" / f"{steps}_G.pth"))
    identical = all(torch.equal(ref_w[k], soak_w[k]) for k in ref_w)
    summary = (f"soak: {steps} steps, {len(kills)} worker kills, {out.count('Resuming from step')} resumes, "
               f"final weights bit-identical: {identical}, wall {time.monotonic() - start:.0f} s")
    print(summary)
    with open(os.path.join(str(tmp_path), "..", "soak_result.txt"), "w") as f:
        f.write(summary + "\n")
    assert kills and identical
