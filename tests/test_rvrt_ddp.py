"""A tiny RVRT trains under 2-process DDP (gloo, CPU) and every rank ends with the same parameters."""

from __future__ import annotations

import json
import math
import os
import sys

from tests.support.helpers import ROOT, assert_ok, base_env, run

WORKER = os.path.join(ROOT, 'tests', 'support', 'rvrt_ddp_worker.py')


def test_rvrt_ddp_two_processes(tmp_path) -> None:
    out = tmp_path / 'result.json'
    cmd = [sys.executable, '-m', 'torch.distributed.run', '--standalone', '--nproc_per_node=2', WORKER, str(out)]
    assert_ok(run(cmd, base_env(), cwd=str(tmp_path), timeout=300))
    result = json.loads(out.read_text())
    assert result['world'] == 2
    (sum0, sq0, moved0), (sum1, sq1, moved1) = result['stats']
    assert sum0 == sum1 and sq0 == sq1, f'ranks diverged: {result["stats"]}'
    assert moved0 > 0 and moved0 == moved1  # the optimizer did step
    losses0, losses1 = result['losses']
    assert all(math.isfinite(v) for v in losses0 + losses1)
    assert losses0 != losses1  # each rank saw its own data
