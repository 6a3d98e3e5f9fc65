"""What deterministic mode (``train.deterministic``) costs in a real training run: the same command with the mode on
and off, alternately, median seconds per step (first step excluded) as JSON lines.

    python benchmarks/bench_determinism.py                       # the demo, 2 rounds of 12 steps
    python benchmarks/bench_determinism.py --opt options/vrt/000_train_vrt_demo.json --steps 20 --rounds 3

Each run is a fresh ``main_train_vrt.py`` process in a temporary folder (no validation, one checkpoint at the end),
at the thread count of the environment (``OMP_NUM_THREADS``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SEC_RE = re.compile(r"iter:\s+([\d,]+), lr:\S+> G_loss: \S+ sec_iter: (\S+)")


def run_once(opt: str, steps: int, deterministic: bool, workdir: str) -> list[float]:
    """Seconds of steps 2..``steps`` of one run."""
    task = f"det_{'on' if deterministic else 'off'}"
    cmd = [sys.executable, str(ROOT / "main_train_vrt.py"), "--opt", opt, "--set", f"task={task}",
           f"path.root={workdir}", f"train.total_iter={steps}", f"train.checkpoint_save={steps}",
           "train.checkpoint_test=0", "train.checkpoint_print=1", f"train.deterministic={str(deterministic).lower()}"]
    proc = subprocess.run(cmd, cwd=workdir, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"run failed ({' '.join(cmd)}):\n{proc.stderr[-2000:]}")
    times = {int(m.group(1).replace(",", "")): float(m.group(2)) for m in SEC_RE.finditer(proc.stdout)}
    return [times[s] for s in sorted(times) if s > 1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--opt", default=str(ROOT / "options" / "vrt" / "000_train_vrt_demo.json"))
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args(argv)
    samples: dict[bool, list[float]] = {True: [], False: []}
    with tempfile.TemporaryDirectory() as workdir:
        for _ in range(args.rounds):
            for mode in (True, False):
                samples[mode] += run_once(args.opt, args.steps, mode, workdir)
                for sub in Path(workdir).iterdir():  # a fresh experiment each time (no resume)
                    shutil.rmtree(sub)
    on, off = statistics.median(samples[True]), statistics.median(samples[False])
    result = {"opt": os.path.relpath(args.opt, ROOT), "threads": os.environ.get("OMP_NUM_THREADS", "default"),
              "steps_timed": len(samples[True]), "sec_iter_deterministic": round(on, 4),
              "sec_iter_default": round(off, 4), "cost": f"{(on / off - 1) * 100:+.1f}%"}
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
