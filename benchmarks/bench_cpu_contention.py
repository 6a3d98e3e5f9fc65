"""A CPU run beside another CPU-bound job: the demo's seconds per training step, and main_test_vrt.py's seconds per
clip, alone and next to a competitor, with the OpenMP wait policy the entry scripts choose and with OpenMP's
default (spinning) policy.

    python benchmarks/bench_cpu_contention.py --steps 12
    python benchmarks/bench_cpu_contention.py --what train --competitor torch

A competitor is a second process that keeps the cores busy: ``spin`` (one Python thread in a busy loop) or
``torch`` (a PyTorch matrix-multiply loop with torch's default thread count and OpenMP policy, like another
training job). Each configuration runs in fresh processes with ``OMP_WAIT_POLICY`` unset (what the entry scripts
then choose), ``PASSIVE`` or ``ACTIVE``.
Prints one JSON line per configuration; the median seconds per step leave out the first two steps.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
DEMO = ROOT / "options" / "vrt" / "000_train_vrt_demo.json"
SEC_ITER = re.compile(r"sec_iter: (\S+)")
COMPETITORS = {
    "spin": "while True: pass",
    "torch": "import torch\na = torch.randn(512, 512)\nwhile True: a @ a",
}


def _env(policy: str) -> dict[str, str]:
    """The environment of a run: ``policy`` is ``unset`` (the entry scripts choose), an ``OMP_WAIT_POLICY`` value,
    or ``KEY=VALUE[,KEY=VALUE]`` settings (``GOMP_SPINCOUNT=10000``, ``OMP_NUM_THREADS=1``)."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("OMP_WAIT_POLICY", "OMP_NUM_THREADS", "GOMP_SPINCOUNT", "VRT_CPU_THREADS")}
    env.update(PYTHONPATH=str(ROOT), VRT_DEVICE="cpu")
    if "=" in policy:
        env.update(item.split("=", 1) for item in policy.split(","))
    elif policy != "unset":
        env["OMP_WAIT_POLICY"] = policy
    return env


def train_seconds(steps: int, policy: str, workdir: str) -> list[float]:
    """Seconds per step of the demo (``policy`` 'unset': as the entry script chooses)."""
    task = f"bench_{policy}_{time.monotonic_ns()}"
    cmd = [sys.executable, str(ROOT / "main_train_vrt.py"), "--opt", str(DEMO), "--set", f"task={task}",
           f"train.total_iter={steps}", "train.checkpoint_test=0", f"train.checkpoint_save={steps}",
           "train.checkpoint_print=1", f"path.root={workdir}/experiments"]
    out = subprocess.run(cmd, env=_env(policy), cwd=workdir, capture_output=True, text=True, check=True).stdout
    return [float(v) for v in SEC_ITER.findall(out)]


def test_seconds(policy: str, workdir: str, frames: int) -> float:
    """Wall seconds of main_test_vrt.py restoring one ``frames``-frame clip with the demo's network (random
    weights: speed only)."""
    import numpy as np

    clip = Path(workdir) / "lq" / "clip"
    if not clip.is_dir():
        import cv2

        clip.mkdir(parents=True)
        rng = np.random.default_rng(0)
        for t in range(frames):
            cv2.imwrite(str(clip / f"{t:08d}.png"), rng.integers(0, 255, (64, 64, 3), dtype=np.uint8))
        import torch

        from engine.options import parse_options
        from models.select_network import define_G

        torch.manual_seed(0)
        net = define_G(parse_options(str(DEMO)))
        torch.save({"params": net.state_dict()}, Path(workdir) / "G.pth")
    cmd = [sys.executable, str(ROOT / "main_test_vrt.py"), "--opt", str(DEMO), "--model_path",
           str(Path(workdir) / "G.pth"), "--folder_lq", str(Path(workdir) / "lq"), "--sigma", "30", "--device", "cpu",
           "--save_dir", str(Path(workdir) / f"out_{time.monotonic_ns()}"), "--num_workers", "0"]
    t0 = time.perf_counter()
    subprocess.run(cmd, env=_env(policy), cwd=workdir, capture_output=True, text=True, check=True)
    return time.perf_counter() - t0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=12, help="training steps per configuration")
    parser.add_argument("--frames", type=int, default=24, help="frames of the test clip")
    parser.add_argument("--what", choices=("train", "test", "both"), default="both")
    parser.add_argument("--competitor", choices=sorted(COMPETITORS), nargs="+", default=["spin", "torch"])
    parser.add_argument("--policies", nargs="+", default=["unset", "PASSIVE"],
                        help="OMP_WAIT_POLICY values to run (unset: what the entry scripts choose)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as workdir:
        for competitor in [None, *args.competitor]:
            for policy in args.policies:
                rival = None
                if competitor:
                    rival = subprocess.Popen([sys.executable, "-c", COMPETITORS[competitor]], env=_env("unset"))
                    time.sleep(1.0)
                try:
                    row = {"competitor": competitor or "none", "omp_wait_policy": policy}
                    if args.what in ("train", "both"):
                        secs = train_seconds(args.steps, policy, workdir)
                        row["train_sec_per_step_median"] = round(statistics.median(secs[2:]), 3)
                        row["train_sec_per_step_max"] = round(max(secs[2:]), 3)
                    if args.what in ("test", "both"):
                        row["test_sec_per_clip"] = round(test_seconds(policy, workdir, args.frames), 2)
                finally:
                    if rival is not None:
                        rival.kill()
                        rival.wait()
                print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
