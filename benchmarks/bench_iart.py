"""IART speed benchmark: ours and (optionally) the official implementation side by side in one process, as JSON lines.

Examples:
    python benchmarks/bench_iart.py --preset released --threads 2 --frames 3
    python benchmarks/bench_iart.py --preset released --iart /tmp/ref_iart/IART --basicsr /tmp/ref_iart/BasicSR \
        --threads 2 --frames 3 --iters 3 --profile
    python benchmarks/bench_iart.py --preset released --device cuda --amp bf16 --frames 16

``--iart``/``--basicsr`` name checkouts of github.com/kai422/IART and github.com/XPixelGroup/BasicSR: the official
network is loaded from them by ``scripts/reference/iart_official.py`` (patched in memory to run on the CPU), built
with the same constructor arguments and given our weights (identical state-dict names). Nothing of it is part of
this repository. A train step is forward, Charbonnier loss, backward and an Adam step (``Runner`` of
``bench_vrt.py``); the runners alternate inside each iteration so both see the same machine load; the medians are
reported with every iteration's time (``*_all_s``), then the peak memory of one train step after a first one, each
network in a fresh process: the live tensor bytes it creates (what ``torch.cuda.max_memory_allocated`` counts on a
GPU) and the rise of the resident-memory high-water mark (allocator effects included). ``--train-only`` times train
steps alone (more of them in the same time); ``--profile`` prints where the time of one train step goes
(``torch.profiler``, operators by self time) for each network.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from torch import nn  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

from benchmarks.bench_vrt import LiveTensorBytes, Runner, add_run_args  # noqa: E402
from models.model_zoo import IART_RELEASED  # noqa: E402
from models.network_iart import IART  # noqa: E402

PRESETS: dict[str, dict[str, Any]] = {
    'tiny': {'mid_channels': 8, 'embed_dim': 12, 'depths': [1, 1], 'num_heads': [2, 2], 'window_size': [3, 4, 4]},
    'released': {k: v for k, v in IART_RELEASED.items() if k != 'cpu_cache_length'},  # REDS N6/N16, Vimeo BI/BD
}


def alternate(runners: dict[str, Runner], warmup: int, iters: int, forward: bool = True) -> dict[str, dict[str, Any]]:
    """Each runner's forward (unless ``forward`` is false) and train-step seconds: the median and every iteration's
    time (``forward_all_s``, ``train_step_all_s``). The runners alternate inside each iteration."""
    for runner in runners.values():
        for _ in range(warmup):
            if forward:
                runner.forward()
            runner.train_step()
    times: dict[str, dict[str, list[float]]] = {name: {'forward': [], 'train_step': []} for name in runners}
    for _ in range(iters):
        for name, runner in runners.items():
            if forward:
                times[name]['forward'].append(runner.forward())
            times[name]['train_step'].append(runner.train_step())
    return {name: {f'{part}{suffix}': value for part, values in t.items() if values
                   for suffix, value in (('_s', statistics.median(values)), ('_all_s', [round(v, 3) for v in values]))}
            for name, t in times.items()}


def profile_table(runner: Runner, rows: int) -> str:
    """``torch.profiler``'s operators of one train step, by self time."""
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if runner.x.device.type == 'cuda' else [])
    with profile(activities=activities) as prof:
        runner.train_step()
    key = 'self_cuda_time_total' if runner.x.device.type == 'cuda' else 'self_cpu_time_total'
    return prof.key_averages().table(sort_by=key, row_limit=rows)


def step_peak_mb(runner: Runner) -> dict[str, float]:
    """Peak memory of one train step (MiB): the live tensor bytes it creates (:class:`LiveTensorBytes`), and the
    rise of the process's resident-memory high-water mark (reset before the step; allocator effects included)."""
    with open('/proc/self/clear_refs', 'w') as fh:
        fh.write('5')
    start = _status_kb('VmRSS')
    with LiveTensorBytes() as tracker:
        runner.train_step()
    return {'peak_mem_mb': tracker.peak / 2**20, 'peak_rss_mb': (_status_kb('VmHWM') - start) / 1024}


def _status_kb(field: str) -> int:
    with open('/proc/self/status') as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith(field + ':'))


def child_peak_mb(argv: list[str] | None, impl: str) -> dict[str, float]:
    """:func:`step_peak_mb` of ``impl`` in a fresh process (a forked child of a process whose OpenMP threads ran
    can hang, and a fresh process keeps the two networks' peaks apart)."""
    args = sys.argv[1:] if argv is None else list(argv)
    proc = subprocess.run([sys.executable, __file__, *args, '--memory-of', impl], capture_output=True, text=True,
                          check=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def part_times(ours: IART, official: nn.Module, x: torch.Tensor, reps: int) -> list[dict[str, Any]]:
    """Where the time goes: the median seconds of each part of both networks on the same inputs, in inference and
    forward + backward (of the output's mean square), alternated: SpyNet's flows of the clip, one implicit alignment,
    one propagation transformer (three stacked frames) and the head of every frame."""
    n, t, _, h, w = x.shape
    gen = torch.Generator().manual_seed(1)
    feats = [torch.randn(n, ours.embed_dim, h, w, generator=gen) for _ in range(t)]
    flow = torch.randn(n, 2, h, w, generator=gen) * 3
    stack = torch.randn(n, 3, ours.embed_dim, h, w, generator=gen)
    official.cpu_cache = False  # set by the official's forward, read by its parts
    parts = {
        'spynet': (lambda: ours.compute_flow(x, False, x.device), lambda: official.compute_flow(x)),
        'implicit_warp': (lambda: ours.implicit_warp(feats[0], feats[1], flow),
                          lambda: official.implicit_warp(feats[0], feats[1], flow.permute(0, 2, 3, 1))),
        'transformer': (lambda: ours.swin_backbone['backward_1'](stack),
                        lambda: official.swin_backbone['backward_1'](stack)),
        'head': (lambda: torch.stack([ours._head(f, x[:, i]) for i, f in enumerate(feats)], 1),
                 lambda: official.upsample(x, {'spatial': feats, 'forward_2': feats})),
    }

    def once(fn: Any, train: bool) -> float:
        start = time.perf_counter()
        with torch.set_grad_enabled(train):
            out = fn()
            if train:
                sum(o.float().square().mean() for o in (out if isinstance(out, tuple) else (out,))).backward()
        return time.perf_counter() - start

    rows = []
    for train in (False, True):
        for tensor in (*feats, flow, stack, x):
            tensor.requires_grad_(train)
        for part, fns in parts.items():
            times: list[list[float]] = [[], []]
            for i in range(reps + 1):  # the first of each is a warm-up
                for j, fn in enumerate(fns):
                    elapsed = once(fn, train)
                    if i:
                        times[j].append(elapsed)
            rows.append({'part': part, 'mode': 'train' if train else 'inference',
                         'ours_s': round(statistics.median(times[0]), 4),
                         'official_s': round(statistics.median(times[1]), 4)})
    x.requires_grad_(False)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--preset', default='tiny', choices=sorted(PRESETS))
    add_run_args(parser, 'torch.compile our network', iters=3)
    parser.add_argument('--iart', metavar='PATH', help='checkout of the official IART, to time beside ours')
    parser.add_argument('--basicsr', metavar='PATH', help='checkout of BasicSR (the official IART imports it)')
    parser.add_argument('--no-checkpoint', action='store_true',
                        help='both networks without activation checkpointing (the official default is on)')
    parser.add_argument('--train-only', action='store_true', help='time train steps only (no forward passes)')
    parser.add_argument('--parts', type=int, nargs='?', const=3, metavar='REPS',
                        help='time each part of both networks alone (SpyNet, implicit alignment, one transformer, the '
                             'head), median of REPS (default 3); needs --iart')
    parser.add_argument('--profile', type=int, nargs='?', const=15, metavar='ROWS',
                        help='print the profiler table of one train step of each network (default 15 rows)')
    parser.add_argument('--memory-of', choices=('ours', 'official'), help=argparse.SUPPRESS)  # the child's role
    args = parser.parse_args(argv)
    if bool(args.iart) != bool(args.basicsr):
        parser.error('--iart and --basicsr go together')

    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    kwargs = {**PRESETS[args.preset], 'use_checkpoint': [not args.no_checkpoint] * 4}
    d, h, w = args.frames or 3, *(args.size or (64, 64))
    gen = torch.Generator().manual_seed(0)
    x = torch.rand(args.batch, d, 3, h, w, generator=gen).to(device)
    y = torch.rand(args.batch, d, 3, 4 * h, 4 * w, generator=gen).to(device)
    torch.manual_seed(0)
    ours = IART(**kwargs).to(device)
    nets: dict[str, nn.Module] = {'ours': torch.compile(ours) if args.compile else ours}
    if args.iart:
        from scripts.reference.iart_official import load_official

        warnings.simplefilter('ignore')  # the official code's meshgrid, checkpoint and timm deprecation warnings
        official = load_official(args.iart, args.basicsr).IART(**kwargs).to(device)
        official.load_state_dict(ours.state_dict(), strict=True)
        nets['official'] = official
    runners = {name: Runner(net, x, y, args.amp) for name, net in nets.items()}
    if args.memory_of:
        runners[args.memory_of].train_step()  # the optimizer's state exists from the first step on
        print(json.dumps(step_peak_mb(runners[args.memory_of])))
        return 0
    common = {'net': 'iart', 'preset': args.preset, 'device': str(device), 'amp': args.amp, 'compile': args.compile,
              'checkpoint': not args.no_checkpoint, 'batch': args.batch, 'frames': d, 'lq_size': [h, w],
              'threads': torch.get_num_threads(), 'torch': torch.__version__,
              'params': sum(p.numel() for p in ours.parameters())}
    measured = alternate(runners, args.warmup, args.iters, forward=not args.train_only)
    for name, m in measured.items():
        if not args.no_memory and device.type == 'cpu':
            m.update(child_peak_mb(argv, name))
        print(json.dumps({'impl': name, **common, **{k: round(v, 4) if isinstance(v, float) else v
                                                      for k, v in m.items()}}), flush=True)
    if 'official' in measured:  # ratios official / ours for times (> 1: ours faster), ours / official for memory
        mine, theirs = measured['ours'], measured['official']
        ratios = {f'official_over_ours_{part}': round(theirs[f'{part}_s'] / mine[f'{part}_s'], 3)
                  for part in ('forward', 'train_step') if f'{part}_s' in mine}
        if 'peak_mem_mb' in mine:
            ratios['ours_over_official_peak_mem'] = round(mine['peak_mem_mb'] / theirs['peak_mem_mb'], 3)
        print(json.dumps(ratios), flush=True)
    if args.parts and 'official' in nets:
        ours.train()
        nets['official'].train()
        for row in part_times(ours, nets['official'], x, args.parts):
            print(json.dumps(row), flush=True)
    if args.profile:
        for name, runner in runners.items():
            print(f'\n== {name}: one train step, operators by self time\n{profile_table(runner, args.profile)}',
                  flush=True)
    return 0


if __name__ == '__main__':
    sys.exit(main())
