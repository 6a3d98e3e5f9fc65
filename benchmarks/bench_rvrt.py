"""RVRT speed/memory benchmark: forward time, train-step time and peak memory as JSON lines.

Examples:
    python benchmarks/bench_rvrt.py --preset tiny --iters 3 --threads 1
    python benchmarks/bench_rvrt.py --preset 001 --device cuda --amp bf16 --frames 16
    python benchmarks/bench_rvrt.py --preset small --compile        # torch.compile the deformable-attention core
    python benchmarks/bench_rvrt.py --preset tiny --threads 2 --baseline HEAD~1   # before/after a change, one process
    python benchmarks/bench_rvrt.py --preset tiny --threads 2 --iters 7 --reference-dir /path/to/KAIR  # vs KAIR

A train step is forward, Charbonnier loss, backward and an Adam step (``Runner`` of ``bench_vrt.py``); peak
memory is the CUDA allocator's peak over one train step, on CPU the peak of the tensor bytes the step creates
(``LiveTensorBytes`` of ``bench_vrt.py``).
Presets 001-006 are the released models' constructor settings (KAIR ``main_test_rvrt.py``). The zero-initialised
last layers of the offset networks are drawn from N(0, 0.02), so that the attention samples away from the flows as a
trained network's does. ``--reference-dir`` times the reference network of a KAIR or RVRT checkout beside ours, with
our weights and its CUDA attention replaced by a CPU stand-in (``rvrt_standin.py``; ``--standin`` picks how its
products are written), and reports the largest output difference of an evaluation forward and the speed-ups against
the faster stand-in of each measure.
"""

from __future__ import annotations

import argparse
import inspect
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from torch import nn  # noqa: E402

from benchmarks.bench_vrt import Runner, add_run_args, load_baseline, measure  # noqa: E402
from benchmarks.rvrt_standin import STANDINS, load_reference  # noqa: E402
from models.model_zoo import TASKS  # noqa: E402
from models.net_io import net_io  # noqa: E402
from models.network_rvrt import RVRT  # noqa: E402

PRESETS: dict[str, dict[str, Any]] = {
    'tiny': {'upscale': 4, 'clip_size': 2, 'window_size': (2, 8, 8), 'num_blocks': (1, 1, 1), 'depths': (2, 2, 2),
             'embed_dims': (24, 24, 24), 'num_heads': (3, 3, 3), 'deformable_groups': 4, 'attention_heads': 4},
    'small': {'upscale': 4, 'clip_size': 2, 'window_size': (2, 8, 8), 'num_blocks': (1, 2, 1), 'depths': (2, 2, 2),
              'embed_dims': (48, 48, 48), 'num_heads': (6, 6, 6), 'deformable_groups': 12, 'attention_heads': 12},
    # the released models' constructor settings (001..006)
    **{name[:3]: spec.net_kwargs() for name, spec in TASKS.items() if spec.net_type == 'rvrt'},
}
# default (frames, H, W) of the LQ input per preset: x4 SR on 64x64; upscale 1 needs H, W > 128
DEFAULT_INPUT = {name: ((4, 64, 64) if cfg['upscale'] == 4 else (4, 192, 192)) for name, cfg in PRESETS.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--preset', default='tiny', choices=sorted(PRESETS))
    add_run_args(parser, 'torch.compile the deformable-attention core', iters=3)
    parser.add_argument('--checkpoint', action='store_true', help='use_checkpoint_attn/ffn in the backbones')
    parser.add_argument('--baseline', metavar='REV',
                        help="also time this repository's RVRT at git revision REV (same weights, alternating)")
    parser.add_argument('--reference-dir', metavar='DIR',
                        help='a checkout of cszn/KAIR or JingyunLiang/RVRT whose RVRT is timed beside ours')
    parser.add_argument('--standin', choices=(*STANDINS, 'both'), default='both',
                        help="how the reference's stand-in attention writes its products (default: both, alternating)")
    args = parser.parse_args(argv)

    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    kwargs = {**PRESETS[args.preset], 'spynet_path': None, 'deform_attn_compile': args.compile,
              'use_checkpoint_attn': args.checkpoint, 'use_checkpoint_ffn': args.checkpoint}
    d, h, w = DEFAULT_INPUT[args.preset]
    d = args.frames or d
    h, w = args.size or (h, w)
    torch.manual_seed(0)
    net = RVRT(**kwargs)
    _draw_offset_layers(net)
    net = net.to(device)
    io = net_io(net)  # channels and scale are what the network states
    gen = torch.Generator().manual_seed(0)
    x = torch.rand(args.batch, d, io.in_chans, h, w, generator=gen).to(device)
    y = torch.rand(args.batch, d, io.out_chans, h * io.scale, w * io.scale, generator=gen).to(device)
    runners = {'ours': Runner(net, x, y, args.amp)}
    if args.baseline:
        baseline = load_baseline(args.baseline, 'models.network_rvrt', 'RVRT')(**kwargs).to(device)
        baseline.load_state_dict(net.state_dict(), strict=True)
        runners['baseline'] = Runner(baseline, x, y, args.amp)
    diffs = {}
    if args.reference_dir:
        for products in STANDINS if args.standin == 'both' else (args.standin,):
            cls = load_reference(args.reference_dir, products)
            accepted = inspect.signature(cls).parameters
            reference = cls(**{k: v for k, v in kwargs.items() if k in accepted}).to(device)
            reference.load_state_dict(net.state_dict(), strict=True)
            runners[f'reference-{products}'] = Runner(reference, x, y, args.amp)
            diffs[f'reference-{products}'] = _eval_difference(net, reference, x)
    results = measure(runners, args.warmup, args.iters, not args.no_memory)
    for impl, m in results.items():
        _report(impl, m, args, net, device, (d, h, w), diffs.get(impl))
    if diffs:
        ours = results['ours']
        faster = {key: min(m[key] for impl, m in results.items() if impl in diffs)
                  for key in ('forward_s', 'train_step_s')}
        print(json.dumps({'speedup_forward': round(faster['forward_s'] / ours['forward_s'], 3),
                          'speedup_train_step': round(faster['train_step_s'] / ours['train_step_s'], 3),
                          'against': 'the faster reference stand-in of each measure'}), flush=True)
    return 0


def _draw_offset_layers(net: nn.Module) -> None:
    """The offset networks' zero-initialised last layers drawn from N(0, 0.02) (a fixed generator): with zeros the
    offsets are the flows alone, which no trained network has."""
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in net.named_parameters():
            if 'conv_offset' in name and not p.any():
                p.copy_(torch.randn(p.shape, generator=gen) * 0.02)


def _eval_difference(net: nn.Module, reference: nn.Module, x: torch.Tensor) -> float:
    """Largest absolute difference of the two networks' evaluation outputs on ``x`` (both left in eval mode)."""
    net.eval()
    reference.eval()
    with torch.no_grad():
        return (net(x) - reference(x)).abs().max().item()


def _report(impl: str, m: dict[str, float], args: argparse.Namespace, net: nn.Module, device: torch.device,
            size: tuple[int, int, int], diff: float | None = None) -> None:
    d, h, w = size
    fwd, step, peak = m['forward_s'], m['train_step_s'], m['peak_mem_mb']
    print(json.dumps({'impl': impl, 'net': 'rvrt', 'preset': args.preset, 'device': str(device), 'amp': args.amp,
                      'compile': args.compile, 'checkpoint': args.checkpoint, 'batch': args.batch, 'frames': d,
                      'lq_size': [h, w], 'threads': torch.get_num_threads(), 'torch': torch.__version__,
                      'params': sum(p.numel() for p in net.parameters()), 'forward_s': round(fwd, 4),
                      'train_step_s': round(step, 4), 'peak_mem_mb': round(peak, 1),
                      'train_samples_per_s': round(args.batch / step, 3),
                      **({} if diff is None else {'eval_max_abs_diff_vs_ours': diff})}), flush=True)


if __name__ == '__main__':
    sys.exit(main())
