"""The benchmark scripts as a user runs them on the CPU (benchmarks/)."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import torch

from benchmarks.bench_vrt import LiveTensorBytes
from tests.support.helpers import ROOT


def test_cpu_benchmark_measures_peak_memory_after_parallel_work():
    """bench_rvrt.py with its default peak-memory measurement, at two threads, ends with the step's peak: the forked
    child it used waited forever in its first parallel region (GNU OpenMP's threads do not survive a fork)."""
    cmd = [sys.executable, 'benchmarks/bench_rvrt.py', '--preset', 'tiny', '--threads', '2', '--iters', '1',
           '--warmup', '1', '--frames', '2', '--size', '36', '36']
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [json.loads(line) for line in done.stdout.splitlines() if line.startswith('{')]
    assert [r['impl'] for r in rows] == ['ours'], done.stdout
    peak = rows[0]['peak_mem_mb']
    assert math.isfinite(peak) and peak > 1, rows[0]  # MiB: a train step of RVRT tiny creates tens of them


def test_live_tensor_bytes_counts_the_peak_of_what_is_alive():
    """The CPU's stand-in for max_memory_allocated: storages created inside, freed ones subtracted, views free."""
    before = torch.empty(1 << 20)
    with LiveTensorBytes() as tracker:
        a = torch.empty(1 << 20)  # 4 MiB
        b = a.view(-1, 2) + 1  # 4 MiB more; the view is no storage
        del a, b
        c = torch.empty(1 << 19)  # 2 MiB, after both were freed
        before.add_(1)  # in place: nothing new
    assert tracker.peak == 8 * 2**20 and tracker.current == 2 * 2**20, (tracker.peak, tracker.current)
    del c
