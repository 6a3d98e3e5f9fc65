"""The benchmark scripts as a user runs them on the CPU (benchmarks/)."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest
import torch

from benchmarks.bench_vrt import LiveTensorBytes
from benchmarks.rvrt_standin import STANDINS, load_reference, standin_deform_attn
from models.layers_deform_attn import deform_attn
from tests.support.deform_attn_loop import attn_inputs, naive_deform_attn
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


@pytest.mark.parametrize('products', STANDINS)
@pytest.mark.parametrize('n,clip,c,heads,groups,kh,kw,stride,pad,dil', [
    (1, 2, 4, 2, 2, 3, 3, 1, 1, 1),  # RVRT's setting in miniature
    (2, 2, 6, 3, 4, 3, 3, 1, 1, 1),  # several clips, groups straddling keys and values
    (1, 3, 4, 1, 1, 3, 3, 1, 1, 1),  # clip 3: frame (j + n) % 3
    (1, 1, 4, 2, 8, 1, 3, 2, 0, 2),  # a 1x3 window, stride 2, dilation 2
])
def test_rvrt_reference_standin_is_the_cuda_operator(products, n, clip, c, heads, groups, kh, kw, stride, pad, dil):
    """The CPU stand-in bench_rvrt.py runs in the reference network computes the kernel's per-pixel loop (the test
    of our operator's), and its gradients are ours: the reference's train step does the same work as the kernel's."""
    q, kv, offset = attn_inputs(n, clip, c, groups=groups, kh=kh, kw=kw)
    args = (kh, kw, stride, pad, dil, heads, groups, clip)
    leaves = [t.clone().requires_grad_() for t in (q, kv, offset)]
    out = standin_deform_attn(*leaves, *args, products=products)
    torch.testing.assert_close(out, naive_deform_attn(q, kv, offset, *args), rtol=1e-10, atol=1e-10)
    ours = [t.clone().requires_grad_() for t in (q, kv, offset)]
    weights = torch.randn(q.shape, dtype=q.dtype, generator=torch.Generator().manual_seed(1))
    (out * weights).sum().backward()
    (deform_attn(*ours, *args) * weights).sum().backward()
    for mine, theirs in zip(leaves, ours):
        torch.testing.assert_close(mine.grad, theirs.grad, rtol=1e-9, atol=1e-9)


_FAKE_OP = """import os
from distutils.version import LooseVersion  # noqa: F401  (the reference imports it)
from torch.utils.cpp_extension import load

deform_attn_ext = load('deform_attn', sources=[os.path.join(os.path.dirname(__file__), 'kernel_not_here.cu')])


def deform_attn(*args):
    return deform_attn_ext.deform_attn_forward(*args)


class DeformAttnPack:
    pass
"""

_FAKE_NETWORK = """import torch
from .op.deform_attn import deform_attn, DeformAttnPack  # noqa: F401


class RVRT(torch.nn.Module):
    def forward(self, q, kv, offset):
        return deform_attn(q, kv, offset, 3, 3, 1, 1, 1, 2, 4, 2)
"""


def test_rvrt_reference_loads_from_a_checkout_without_its_cuda_build(tmp_path):
    """A checkout laid out as KAIR's (models/network_rvrt.py importing models/op/deform_attn.py, which builds a CUDA
    extension when imported) loads: no build is attempted, and the network's attention is the stand-in's."""
    (tmp_path / 'models' / 'op').mkdir(parents=True)
    (tmp_path / 'models' / 'op' / 'deform_attn.py').write_text(_FAKE_OP)
    (tmp_path / 'models' / 'network_rvrt.py').write_text(_FAKE_NETWORK)
    q, kv, offset = attn_inputs(1, 2, 4, groups=4)
    out = load_reference(str(tmp_path), 'einsum')()(q, kv, offset)
    torch.testing.assert_close(out, naive_deform_attn(q, kv, offset, 3, 3, 1, 1, 1, 2, 4, 2), rtol=1e-10, atol=1e-10)
    bare = tmp_path / 'bare'  # a network file without the operator's module
    bare.mkdir()
    (bare / 'network_rvrt.py').write_text(_FAKE_NETWORK)
    with pytest.raises(SystemExit, match=f'--reference-dir {bare}: no models/network_rvrt.py with models/op/'):
        load_reference(str(bare), 'sum')
