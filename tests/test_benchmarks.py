"""The benchmark scripts as a user runs them on the CPU (benchmarks/)."""

from __future__ import annotations

import json
import math
import subprocess
import sys

from tests.support.helpers import ROOT


def test_cpu_benchmark_measures_peak_memory_after_parallel_work():
    """bench_rvrt.py with its default peak-memory measurement, at two threads, ends with a number: the forked child
    it used waited forever in its first parallel region (GNU OpenMP's threads do not survive a fork)."""
    cmd = [sys.executable, 'benchmarks/bench_rvrt.py', '--preset', 'tiny', '--threads', '2', '--iters', '1',
           '--warmup', '1', '--frames', '2', '--size', '36', '36']
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [json.loads(line) for line in done.stdout.splitlines() if line.startswith('{')]
    assert [r['impl'] for r in rows] == ['ours'], done.stdout
    peak = rows[0]['peak_mem_mb']
    assert math.isfinite(peak) and peak >= 0, rows[0]
