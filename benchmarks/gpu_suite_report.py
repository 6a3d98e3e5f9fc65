"""The markdown report of ``benchmarks/gpu_suite.py`` (tables ready for benchmarks/RESULTS.md)."""

from __future__ import annotations

import json
from typing import Any


def _table(rows: list[dict[str, Any]], columns: list[str]) -> list[str]:
    def fmt(v: Any) -> str:
        if isinstance(v, float):
            return f'{v:.3g}' if abs(v) < 1e-2 or abs(v) >= 1e4 else f'{v:.3f}'.rstrip('0').rstrip('.')
        return '' if v is None else str(v)
    lines = ['| ' + ' | '.join(columns) + ' |', '|' + '---|' * len(columns)]
    lines += ['| ' + ' | '.join(fmt(r.get(c)) for c in columns) + ' |' for r in rows]
    return lines


def markdown(results: dict[str, Any], command: str) -> str:
    env = results.get('environment', {})
    out = ['## GPU suite (benchmarks/gpu_suite.py)', '', f'Command: `{command}`', '']
    out += [f'Environment: {json.dumps({k: v for k, v in env.items() if k not in ("status", "seconds")})}', '']
    sections = [('goldens', ['net', 'case', 'output_err', 'output_tol', 'grad_rel_err', 'grad_tol', 'ok']),
                ('parity', ['preset', 'precision', 'output_rel_err', 'psnr_vs_fp32_db', 'loss_rel_diff',
                            'grads_finite']),
                ('train', ['preset', 'clip', 'precision', 'impl', 'train_step_s', 'forward_s', 'peak_gb', 'plan_gb',
                           'speedup', 'mem_ratio', 'error']),
                ('deterministic', ['preset', 'clip', 'default_step_s', 'deterministic_step_s', 'bit_identical']),
                ('tiled', ['job', 'precision', 'lq', 'tile', 'out', 'seconds', 'frames_per_s', 'peak_gb', 'finite']),
                ('metrics', ['metric', 'size', 'frames', 'frames_per_forward', 'ms_per_frame', 'ms_per_frame_one',
                             'speedup', 'peak_gb', 'cut_invariant', 'skipped']),
                ('gan', ['preset', 'clip', 'precision', 'step_s', 'peak_gb', 'finite', 'sn_fp32', 'ddp_units',
                         'scaler_updates', 'scale'])]
    for name, columns in sections:
        part = results.get(name, {})
        out += [f'### {name} ({part.get("status")}, {part.get("seconds")} s)', '']
        if part.get('rows'):
            out += _table(part['rows'], columns) + ['']
        elif part.get('status') != 'ok':
            out += [f'{part.get("error") or part.get("reason")}', '']
    kernels = results.get('train', {}).get('sdpa', {})
    if kernels:
        out += ['### SDPA kernels (first train step)', '']
        rows = [{'run': k, **{c: json.dumps(v[c]) if isinstance(v[c], (dict, list)) else v[c] for c in v}}
                for k, v in kernels.items()]
        out += _table(rows, ['run', 'calls', 'forward', 'trainable_bias', 'backward', 'head_dims', 'max_folded',
                             'not_eligible']) + ['']
    if results.get('problems'):
        out += ['### Problems', ''] + [f'- {p}' for p in results['problems']] + ['']
    for name in ('compile', 'ddp'):
        part = results.get(name, {})
        out += [f'### {name} ({part.get("status")}, {part.get("seconds")} s)', '',
                json.dumps({k: v for k, v in part.items() if k not in ('status', 'seconds', 'traceback')}), '']
    return '\n'.join(out)
