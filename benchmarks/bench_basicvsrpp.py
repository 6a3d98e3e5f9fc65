"""BasicVSR++ speed benchmark: ours and (optionally) the reference side by side in one process, as JSON lines.

Examples:
    python benchmarks/bench_basicvsrpp.py --preset c64n7 --threads 2 --frames 10
    python benchmarks/bench_basicvsrpp.py --preset c64n7 --ref /tmp/ref_bvsrpp --threads 2 --iters 3
    python benchmarks/bench_basicvsrpp.py --preset deblur --device cuda --amp bf16 --frames 30
    python benchmarks/bench_basicvsrpp.py --preset c64n7 --baseline HEAD~1 --threads 2   # before/after, one process

``--ref PATH`` names a directory holding BasicSR's ``basicsr/archs/basicvsrpp_arch.py`` and what it imports
(``arch_util``, ``basicvsr_arch``, ``spynet_arch``, ``edvr_arch``, ``basicsr.ops.dcn.ModulatedDeformConvPack``,
``basicsr.utils.registry``): the reference network, built with the same constructor arguments and given our weights
(identical state-dict names). Nothing of it is part of this repository. A train step is forward, Charbonnier loss,
backward and an Adam step (``Runner`` of ``bench_vrt.py``); the runners alternate inside each iteration so both see
the same machine load; the medians are reported. ``--baseline REV`` times this repository's own network at git
revision REV beside the working tree's (``load_baseline`` of ``bench_vrt.py``), given the same weights.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from torch import nn  # noqa: E402

from benchmarks.bench_vrt import Runner, add_run_args, load_baseline, measure  # noqa: E402
from models.network_basicvsrpp import BasicVSRPlusPlus  # noqa: E402

PRESETS: dict[str, dict[str, Any]] = {
    'tiny': {'mid_channels': 16, 'num_blocks': 2, 'is_low_res_input': True},
    'c64n7': {'mid_channels': 64, 'num_blocks': 7, 'is_low_res_input': True},  # REDS4 / Vimeo-90K releases
    'deblur': {'mid_channels': 64, 'num_blocks': 15, 'is_low_res_input': False},  # DVD / GoPro releases
    'c128n25': {'mid_channels': 128, 'num_blocks': 25, 'is_low_res_input': True},  # NTIRE 2021 VSR release
}
# default (frames, H, W) of the input: x4 from 64x64 LQ frames (the reference's smallest), same-size from 256x256
DEFAULT_INPUT = {name: ((10, 64, 64) if cfg['is_low_res_input'] else (10, 256, 256)) for name, cfg in PRESETS.items()}


def load_reference(path: str) -> type[nn.Module]:
    """BasicSR's ``BasicVSRPlusPlus`` from the directory ``path`` (put first on ``sys.path``)."""
    if not (Path(path) / 'basicsr' / 'archs' / 'basicvsrpp_arch.py').is_file():
        raise SystemExit(f'--ref {path}: no basicsr/archs/basicvsrpp_arch.py in it')
    sys.path.insert(0, str(Path(path).resolve()))
    return importlib.import_module('basicsr.archs.basicvsrpp_arch').BasicVSRPlusPlus


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--preset', default='tiny', choices=sorted(PRESETS))
    add_run_args(parser, 'torch.compile our network', iters=3)
    parser.add_argument('--ref', metavar='PATH', help='directory with the reference (see above) to time beside ours')
    parser.add_argument('--baseline', metavar='REV', help="also time this repository's network at git revision REV")
    args = parser.parse_args(argv)

    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    kwargs = dict(PRESETS[args.preset])
    d, h, w = DEFAULT_INPUT[args.preset]
    d = args.frames or d
    h, w = args.size or (h, w)
    scale = 4 if kwargs['is_low_res_input'] else 1
    gen = torch.Generator().manual_seed(0)
    x = torch.rand(args.batch, d, 3, h, w, generator=gen).to(device)
    y = torch.rand(args.batch, d, 3, h * scale, w * scale, generator=gen).to(device)
    torch.manual_seed(0)
    ours = BasicVSRPlusPlus(**kwargs).to(device)
    nets: dict[str, nn.Module] = {'ours': torch.compile(ours) if args.compile else ours}
    if args.baseline:
        baseline = load_baseline(args.baseline, 'models.network_basicvsrpp', 'BasicVSRPlusPlus')(**kwargs).to(device)
        baseline.load_state_dict(ours.state_dict(), strict=True)
        nets['baseline'] = baseline
    if args.ref:
        reference = load_reference(args.ref)(**kwargs).to(device)
        reference.load_state_dict(ours.state_dict(), strict=True)
        nets['reference'] = reference
    runners = {name: Runner(net, x, y, args.amp) for name, net in nets.items()}
    common = {'net': 'basicvsrpp', 'preset': args.preset, 'device': str(device), 'amp': args.amp,
              'compile': args.compile, 'batch': args.batch, 'frames': d, 'lq_size': [h, w],
              'threads': torch.get_num_threads(), 'torch': torch.__version__,
              'params': sum(p.numel() for p in ours.parameters())}
    results = {}
    for name, m in measure(runners, args.warmup, args.iters, not args.no_memory).items():
        results[name] = {'impl': name, **common, 'forward_s': round(m['forward_s'], 4),
                         'train_step_s': round(m['train_step_s'], 4), 'peak_mem_mb': round(m['peak_mem_mb'], 1)}
        print(json.dumps(results[name]), flush=True)
    if 'baseline' in results:
        r, o = results['baseline'], results['ours']
        print(json.dumps({'speedup_vs_baseline_train_step': round(r['train_step_s'] / o['train_step_s'], 3),
                          'speedup_vs_baseline_forward': round(r['forward_s'] / o['forward_s'], 3)}), flush=True)
    if 'reference' in results:
        r, o = results['reference'], results['ours']
        print(json.dumps({'speedup_train_step': round(r['train_step_s'] / o['train_step_s'], 3),
                          'speedup_forward': round(r['forward_s'] / o['forward_s'], 3),
                          'peak_mem_ratio': round(o['peak_mem_mb'] / r['peak_mem_mb'], 3)}), flush=True)
    return 0


if __name__ == '__main__':
    sys.exit(main())
