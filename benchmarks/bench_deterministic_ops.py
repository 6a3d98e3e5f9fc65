"""Cost of the deterministic backward formulations (models/layers_warp.py) against the default ops.

For each op at a size VRT/RVRT use, the forward and the backward are timed with the formulations off (the default
kernels) and forced on, and printed as JSON lines (median milliseconds; on CUDA also the peak memory of forward +
backward). On the CPU the default kernels are already deterministic and the switch is off in training; the CPU
numbers show what the formulations cost relative to the native kernels.

Examples:
    python benchmarks/bench_deterministic_ops.py --threads 1
    python benchmarks/bench_deterministic_ops.py --device cuda --deterministic
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torchvision  # noqa: E402
from torch import Tensor  # noqa: E402

from models.layers_deform_attn import deform_attn  # noqa: E402
from models.layers_deform_conv import deform_conv3x3_sampled  # noqa: E402
from models.layers_warp import flow_warp, force_deterministic_kernels, pad, resize_bilinear  # noqa: E402

Case = tuple[Callable[..., Tensor], list[Tensor]]


def _cases(device: torch.device) -> dict[str, Case]:
    gen = torch.Generator().manual_seed(0)

    def rand(*shape: int, scale: float = 1.0) -> Tensor:
        return (scale * torch.randn(*shape, generator=gen)).to(device)

    n, c, h, w, groups = 12, 64, 64, 64, 16
    return {
        'flow_warp bilinear zeros (12,64,64,64)': (flow_warp, [rand(n, c, h, w), rand(n, h, w, 2, scale=3)]),
        'flow_warp bilinear border (24,3,128,128)': (
            lambda x, f: flow_warp(x, f, padding_mode='border'), [rand(24, 3, 128, 128), rand(24, 128, 128, 2)]),
        'deform_conv sampled (12,64,64,64) G16': (deform_conv3x3_sampled, [
            rand(n, c, h, w), rand(n, 18 * groups, h, w, scale=3), torch.rand(n, 9 * groups, h, w).to(device),
            rand(c, c, 3, 3, scale=0.05), rand(c)]),
        'deform_conv torchvision (12,64,64,64) G16': (
            lambda x, o, m, wt, b: torchvision.ops.deform_conv2d(x, o, wt, b, padding=(1, 1), mask=m), [
                rand(n, c, h, w), rand(n, 18 * groups, h, w, scale=3), torch.rand(n, 9 * groups, h, w).to(device),
                rand(c, c, 3, 3, scale=0.05), rand(c)]),
        'deform_attn RVRT (kv 1x2x288x64x64, G12, 12 heads)': (
            lambda q, kv, off: deform_attn(q, kv, off, 3, 3, 1, 1, 1, 12, 12, 2),
            [rand(2, 1, 144, h, w), rand(1, 2, 288, h, w), rand(2, 2 * 12 * 9 * 2, h, w, scale=2)]),
        'resize x2 align_corners (12,2,128,128)': (
            lambda x: resize_bilinear(x, scale_factor=2, align_corners=True), [rand(12, 2, 128, 128)]),
        'resize to size (12,2,256,256)->(250,250)': (
            lambda x: resize_bilinear(x, size=(250, 250), align_corners=False), [rand(12, 2, 256, 256)]),
        'pad replicate bottom (12,2,63,64)': (lambda x: pad(x, (0, 0, 0, 1), 'replicate'), [rand(12, 2, 63, 64)]),
        'pad reflect 3 (2,64,256,256)': (lambda x: pad(x, (3, 3, 3, 3), 'reflect'), [rand(2, 64, 256, 256)]),
    }


def _sync(device: torch.device) -> None:
    if device.type == 'cuda':
        torch.cuda.synchronize(device)


def measure(fn: Callable[..., Tensor], inputs: list[Tensor], forced: bool, iters: int,
            device: torch.device) -> dict[str, float]:
    """Median forward and backward milliseconds (and the CUDA peak memory of one forward + backward)."""
    fwd, bwd, peak = [], [], 0.0
    with force_deterministic_kernels(forced):
        for i in range(iters + 1):  # the first iteration warms up
            leaves = [t.detach().clone().requires_grad_(t.is_floating_point()) for t in inputs]
            if device.type == 'cuda':
                torch.cuda.reset_peak_memory_stats(device)
                base = torch.cuda.memory_allocated(device)
            _sync(device)
            t0 = time.perf_counter()
            out = fn(*leaves)
            _sync(device)
            t1 = time.perf_counter()
            out.backward(torch.ones_like(out))
            _sync(device)
            t2 = time.perf_counter()
            if i:
                fwd.append(t1 - t0)
                bwd.append(t2 - t1)
            if device.type == 'cuda':
                peak = max(peak, (torch.cuda.max_memory_allocated(device) - base) / 2**20)
            del out, leaves
    result = {'forward_ms': round(1e3 * statistics.median(fwd), 2),
              'backward_ms': round(1e3 * statistics.median(bwd), 2)}
    if device.type == 'cuda':
        result['peak_mib'] = round(peak, 1)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--device', default='cpu')
    parser.add_argument('--threads', type=int, default=1, help='CPU intra-op threads')
    parser.add_argument('--iters', type=int, default=5)
    parser.add_argument('--deterministic', action='store_true',
                        help='torch.use_deterministic_algorithms(True) (CUDA: the default kernels then raise)')
    parser.add_argument('--only', default='', help='run the cases whose name contains this text')
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    if args.deterministic:
        torch.use_deterministic_algorithms(True)
    for name, (fn, inputs) in _cases(device).items():
        if args.only not in name:
            continue
        row: dict[str, object] = {'op': name, 'device': str(device), 'threads': args.threads}
        for label, forced in (('default', False), ('deterministic', True)):
            try:
                row[label] = measure(fn, inputs, forced, args.iters, device)
            except RuntimeError as err:  # e.g. a CUDA kernel without a deterministic implementation
                row[label] = {'error': str(err).splitlines()[0]}
        print(json.dumps(row), flush=True)


if __name__ == '__main__':
    main()
