"""The GPU suite's code on tiny shapes on the CPU (``--device cpu --quick``), so that it runs when a GPU is lent."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.support.helpers import ROOT, base_env
from utils.utils_numerics import cpu_has_native_bf16


def test_quick_suite_on_the_cpu_writes_its_json_and_tables(tmp_path) -> None:
    out = tmp_path / 'suite'
    proc = subprocess.run([sys.executable, 'benchmarks/gpu_suite.py', '--device', 'cpu', '--quick', '--out', str(out)],
                          cwd=ROOT, env=base_env(threads=1), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    results = json.loads((out / 'suite.json').read_text())
    sections = ('environment', 'goldens', 'parity', 'train', 'ddp', 'deterministic', 'tiled', 'metrics', 'compile',
                'gan')
    assert {k: results[k]['status'] for k in sections} == dict.fromkeys(sections, 'ok')
    assert results['failed'] == [] and results['problems'] == [] and results['quick'] is True
    assert results['environment']['policy']['tf32'] is False
    assert all(row['ok'] for row in results['goldens']['rows'])
    assert all(row['grads_finite'] and row['output_rel_err'] < 0.05 for row in results['parity']['rows'])
    rows = results['train']['rows']
    bf16 = {('vrt_001', 'bf16')} if cpu_has_native_bf16() else set()  # emulated bf16 is 30-60x slower
    assert {(r['preset'], r['precision']) for r in rows} == {('vrt_001', 'fp32'), ('rvrt_001', 'fp32')} | bf16
    assert all(r['train_step_s'] > 0 and r['plan_gb'] > 0 for r in rows)
    sdpa = results['train']['sdpa']
    assert sdpa['vrt_001/fp32']['head_dims'] == [20, 30] and sdpa['vrt_001/fp32']['calls'] > 0
    assert sdpa['vrt_001/fp32']['trainable_bias']  # the relative-position bias is trained through attention
    assert all(r['bit_identical'] for r in results['deterministic']['rows'])
    assert results['ddp']['backend'] == 'gloo' and results['ddp']['ddp_step_s'] > 0
    assert all(r['finite'] and r['frames_per_s'] > 0 for r in results['tiled']['rows'])
    assert {(r['metric'], r['frames_per_forward'], r['cut_invariant']) for r in results['metrics']['rows']} == \
        {('lpips', 1, True), ('tlp', 1, True)}  # one frame a forward on the CPU
    assert 'skipped' in results['compile']
    table = (out / 'suite.md').read_text()
    assert '### train' in table and '| vrt_001 | 2x3x40x40 | fp32 | ours |' in table


def test_a_suite_stopped_from_outside_keeps_the_sections_it_finished(tmp_path, monkeypatch) -> None:
    """A lease's time limit kills the run where it stands: the JSON and tables of the finished sections are on disk
    (the first GPU run lost its parity numbers when the suite still wrote them only at the end)."""
    from benchmarks import gpu_suite

    def stopped(_suite) -> None:
        raise KeyboardInterrupt  # what no section catches, as a kill

    monkeypatch.setenv('CUBLAS_WORKSPACE_CONFIG', ':4096:8')  # the suite sets it; put back afterwards
    monkeypatch.setattr(gpu_suite, 'parity', stopped)
    out = tmp_path / 'suite'
    try:
        gpu_suite.main(['--device', 'cpu', '--quick', '--out', str(out), '--only', 'environment', 'parity'])
    except KeyboardInterrupt:
        pass
    else:
        raise AssertionError('the stop did not reach the caller')
    results = json.loads((out / 'suite.json').read_text())
    assert results['environment']['status'] == 'ok' and 'parity' not in results
    assert '--only environment parity' in (out / 'suite.md').read_text()
    assert sorted(p.name for p in out.iterdir()) == ['suite.json', 'suite.md']  # no temporary file left
