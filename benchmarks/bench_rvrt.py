"""RVRT speed/memory benchmark: forward time, train-step time and peak memory as JSON lines.

Examples:
    python benchmarks/bench_rvrt.py --preset tiny --iters 3 --threads 1
    python benchmarks/bench_rvrt.py --preset 001 --device cuda --amp bf16 --frames 16
    python benchmarks/bench_rvrt.py --preset small --compile        # torch.compile the deformable-attention core
    python benchmarks/bench_rvrt.py --preset tiny --threads 2 --baseline HEAD~1   # before/after a change, one process

A train step is forward, Charbonnier loss, backward and an Adam step (``Runner`` of ``bench_vrt.py``); peak
memory is the CUDA allocator's peak over one train step, on CPU the peak of the tensor bytes the step creates
(``LiveTensorBytes`` of ``bench_vrt.py``).
Presets 001-006 are the released models' constructor settings (KAIR ``main_test_rvrt.py``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from torch import nn  # noqa: E402

from benchmarks.bench_vrt import Runner, add_run_args, load_baseline, measure  # noqa: E402
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
    net = RVRT(**kwargs).to(device)
    io = net_io(net)  # channels and scale are what the network states
    gen = torch.Generator().manual_seed(0)
    x = torch.rand(args.batch, d, io.in_chans, h, w, generator=gen).to(device)
    y = torch.rand(args.batch, d, io.out_chans, h * io.scale, w * io.scale, generator=gen).to(device)
    runners = {'ours': Runner(net, x, y, args.amp)}
    if args.baseline:
        baseline = load_baseline(args.baseline, 'models.network_rvrt', 'RVRT')(**kwargs).to(device)
        baseline.load_state_dict(net.state_dict(), strict=True)
        runners['baseline'] = Runner(baseline, x, y, args.amp)
    for impl, m in measure(runners, args.warmup, args.iters, not args.no_memory).items():
        _report(impl, m, args, net, device, (d, h, w))
    return 0


def _report(impl: str, m: dict[str, float], args: argparse.Namespace, net: nn.Module, device: torch.device,
            size: tuple[int, int, int]) -> None:
    d, h, w = size
    fwd, step, peak = m['forward_s'], m['train_step_s'], m['peak_mem_mb']
    print(json.dumps({'impl': impl, 'net': 'rvrt', 'preset': args.preset, 'device': str(device), 'amp': args.amp,
                      'compile': args.compile, 'checkpoint': args.checkpoint, 'batch': args.batch, 'frames': d,
                      'lq_size': [h, w], 'threads': torch.get_num_threads(), 'torch': torch.__version__,
                      'params': sum(p.numel() for p in net.parameters()), 'forward_s': round(fwd, 4),
                      'train_step_s': round(step, 4), 'peak_mem_mb': round(peak, 1),
                      'train_samples_per_s': round(args.batch / step, 3)}), flush=True)


if __name__ == '__main__':
    sys.exit(main())
