"""Estimate the peak GPU memory per process of a training recipe, and the settings that fit a given GPU.

Usage:
    python scripts/plan_memory.py --opt options/vrt/001_train_vrt_videosr_bi_reds_6frames.json --world-size 8
    python scripts/plan_memory.py --opt options/vrt/005_train_vrt_videodeblurring_dvd.json --gpu-mem 24

Prints one line per precision (fp32, bf16) for the recipe as it is: the estimated allocator peak (what
``torch.cuda.max_memory_allocated`` would report) and its parts. With ``--gpu-mem`` it lists the settings that keep
the recipe's global batch and fit in that much memory per process (activation checkpointing, ``grad_accum_steps``,
``amp``), counting the CUDA context and fragmentation on top. The estimate comes from a forward pass on the meta
device along the CUDA code path: no GPU is needed (see models/memory_plan.py and docs/gpu.md).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.options import parse_options  # noqa: E402
from models.memory_plan import estimate_peak_memory, fits, needed_gb  # noqa: E402
from utils.utils_option import OptionError  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--opt', required=True, help='option file (KAIR format)')
    parser.add_argument('--gpu-mem', type=float, help='GB of memory per GPU: list the settings that fit')
    parser.add_argument('--world-size', type=int, default=int(os.environ.get('WORLD_SIZE', 1)),
                        help='training processes (GPUs); dataloader_batch_size is split over them (default 1)')
    parser.add_argument('--set', dest='overrides', action='append', default=[], metavar='KEY=VALUE',
                        help='option override, as for main_train_vrt.py (repeatable)')
    parser.add_argument('--json', help='also write the numbers to this JSON file')
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format='%(message)s')
    try:
        opt = parse_options(args.opt, args.overrides)
    except OptionError as err:
        print(f'error: {err}', file=sys.stderr)
        return 2
    world = max(1, args.world_size)
    data = next(v for k, v in opt['datasets'].items() if k.startswith('train'))
    accum = int(opt['train']['grad_accum_steps'])
    total = int(data['dataloader_batch_size'])
    print(f'{Path(args.opt).name}: global batch {total} clip(s) over {world} process(es) x {accum} accumulation '
          f'step(s) -> {max(1, total // (world * accum))} clip(s) per forward')
    report = {'opt': args.opt, 'world_size': world, 'estimates': {}, 'fits': None}
    for amp in ('none', 'bf16'):
        estimate = estimate_peak_memory(opt, 'cuda', amp, world_size=world)
        report['estimates'][estimate.precision] = {**estimate.as_dict(), 'needed_gb': needed_gb(estimate)}
        print(f'{estimate.summary()}; needs about {needed_gb(estimate):.1f} GB of device memory')
    if args.gpu_mem:
        found = fits(opt, args.gpu_mem, world)
        report['fits'] = found
        if not found:
            print(f'Nothing fits in {args.gpu_mem:g} GB per process at a global batch of {total}: use more GPUs '
                  '(--world-size) or a smaller gt_size / num_frame')
        else:
            print(f'Settings that fit in {args.gpu_mem:g} GB per process at the same global batch ({total} clips), '
                  'cheapest first:')
            for f in found:
                sets = [f'train.amp={f["amp"]}', f'train.grad_accum_steps={f["grad_accum_steps"]}']
                sets += [f'netG.{k}={json.dumps(v)}' for k, v in f['net_flags'].items()]
                print(f'  {f["needed_gb"]:6.1f} GB  {f["amp"]:>4}, {f["checkpointing"]}, {f["micro_batch"]} clip(s) '
                      f'per forward:  --set ' + ' --set '.join(sets))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == '__main__':
    sys.exit(main())
