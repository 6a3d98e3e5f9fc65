"""Where the time goes at the released sizes: one training step and one tiled evaluation of VRT, RVRT, BasicVSR++ or
IART built with a released model's constructor, by part of the network; or which share of a training step's wall time
is Python (the interpreter and the bindings) rather than torch's operators, sampled by ``py-spy`` or ``perf``.

Examples:
    python benchmarks/profile_released.py --net vrt                  # VRT 001's constructor, torch.profiler by part
    python benchmarks/profile_released.py --net iart                 # IART's released constructor
    python benchmarks/profile_released.py --net rvrt --preset 004 --size 192 192 --eval-size 192 192 --eval-tile 6 144
    python benchmarks/profile_released.py --net vrt --sampler py-spy --steps 1 --out /tmp/vrt_pyspy.txt
    python benchmarks/profile_released.py --net vrt --sampler perf --steps 1 --out /tmp/vrt.perf

The parts, the training step (forward, Charbonnier loss, backward, Adam, EMA update) and the attribution are those of
``benchmarks/profile_step.py`` (whose labels include IART's modules); the network has random
weights (speed does not depend on them). Defaults: ``--net`` picks the released constructor (VRT
``001_VRT_videosr_bi_REDS_6frames``, RVRT ``001_RVRT_videosr_bi_REDS_30frames``, BasicVSR++ c64n7, IART's one
constructor), a training clip of a few 64x64 LQ frames (VRT 6, RVRT 4, BasicVSR++ 6, IART 3), and an evaluation of
6 frames of 96x96 LQ in tiles of 6 frames x 64 px overlapping by 2 frames / 16 px (4 tiles). The training step is
run once to warm up (optimizer state, cached masks), the evaluation's warm-up is one forward of a tile-sized clip,
then each runs once under ``torch.profiler``.

``--sampler py-spy`` / ``--sampler perf``: after the warm-up step the script attaches the sampler to its own process
for ``--steps`` training steps without ``torch.profiler`` and prints where the samples fell: for py-spy (main
thread, ``--native``, 100 Hz) the share of samples inside torch's operator library (``libtorch_cpu``: ATen kernels,
oneDNN, the dispatcher and the autograd engine) against the rest (Python code, the interpreter, ``libtorch_python``'s
argument parsing and wrapping, ``libc``), and the Python functions the rest is spent in; for perf (every thread,
cpu-clock, 250 Hz, the kernel included) the share of CPU time by shared object (``perf report --sort dso``), the
kernel's top symbols (page faults, thread wake-ups), the share in copy kernels, and how busy the cores were.

Prints Markdown tables and one JSON line; ``--merge LOG...`` prints one table of several runs' outputs.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from torch import nn  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

from benchmarks import profile_step  # noqa: E402
from models import network_iart  # noqa: E402
from models.model_zoo import IART_RELEASED  # noqa: E402
from models.net_io import net_io  # noqa: E402
from models.video_inference import infer_video  # noqa: E402

PRESETS: dict[str, dict[str, dict[str, Any]]] = {**profile_step.PRESETS, 'iart': {'released': dict(IART_RELEASED)}}
RELEASED = {'vrt': '001', 'rvrt': '001', 'basicvsrpp': 'c64n7', 'iart': 'released'}
TRAIN_FRAMES = {'vrt': 6, 'rvrt': 4, 'basicvsrpp': 6, 'iart': 3}

# the operator library: a py-spy sample with a frame in one of these is inside a torch operator; 'jit' is code in
# anonymous executable memory (py-spy's '(?)' frames, perf's [JIT]): oneDNN's generated convolution/matmul kernels
OPERATOR_LIBS = ('libtorch_cpu', 'libdnnl', 'libmkl', 'libgomp', 'libiomp', 'libsleef', 'jit')


def build(net_type: str, preset: str) -> nn.Module:
    """The network of ``PRESETS[net_type][preset]``, random weights (seed 0), SpyNet unloaded."""
    kwargs = {**PRESETS[net_type][preset], 'spynet_path': None}
    if net_type == 'iart':
        torch.manual_seed(0)
        return network_iart.IART(**kwargs)
    return profile_step.build(net_type, preset)


def top_operators(prof: profile, default: str, count: int) -> dict[str, dict[str, float]]:
    """Per part, its ``count`` operators of most own CPU time (ms), attributed as :func:`profile_step.attribute`."""
    events = [e for e in prof.events() if e.device_type.name == 'CPU']
    by_sequence: dict[int, str] = {}
    for e in events:
        if e.sequence_nr >= 0 and not e.name.startswith('autograd::'):
            part = profile_step._part_of(e, {})
            if part and e.sequence_nr not in by_sequence:
                by_sequence[e.sequence_nr] = part
    ops: dict[str, Counter[str]] = {}
    for e in events:
        if not e.name.startswith(profile_step.LABEL):
            part = profile_step._part_of(e, by_sequence) or default
            ops.setdefault(part, Counter())[e.name] += e.self_cpu_time_total / 1e3
    return {part: {name: round(ms, 1) for name, ms in c.most_common(count)} for part, c in ops.items()}


def profiled_train(net: nn.Module, net_type: str, preset: str, x: torch.Tensor, y: torch.Tensor,
                   sampler: str | None, steps: int, out: str, top: int = 0) -> dict[str, Any]:
    """One warm-up step, then one step under torch.profiler (parts) or ``steps`` steps under ``sampler``."""
    ema = build(net_type, preset)
    ema.load_state_dict(net.state_dict())
    opt = torch.optim.Adam(net.parameters(), lr=1e-4, betas=(0.9, 0.99))
    net.train()
    start = time.perf_counter()
    profile_step.train_step(net, ema, opt, x, y)
    result: dict[str, Any] = {'warmup_step_s': round(time.perf_counter() - start, 3)}
    if sampler:
        with attached(sampler, out) as timing:
            for _ in range(steps):
                profile_step.train_step(net, ema, opt, x, y)
        result['sampled_steps'] = steps
        result['sampled_step_s'] = round(timing['seconds'] / steps, 3)
        return result
    with profile_step.labels(net), profile(activities=[ProfilerActivity.CPU]) as prof:
        start = time.perf_counter()
        profile_step.train_step(net, ema, opt, x, y)
        result['train_step_s'] = round(time.perf_counter() - start, 3)
    result['parts'] = profile_step.attribute(prof, 'backward engine, other')
    if top:
        result['top_ops'] = top_operators(prof, 'backward engine, other', top)
    return result


def profiled_eval(net: nn.Module, lq: torch.Tensor, tile: tuple[int, int], overlap: tuple[int, int],
                  top: int = 0) -> dict[str, Any]:
    """infer_video on ``lq`` in tiles, once under torch.profiler, after one tile-sized forward."""
    io = net_io(net)
    net.eval()
    kwargs = {'scale': io.scale, 'window_size': io.input_multiple, 'in_chans': io.in_chans,
              'vfi': io.frame_interpolation, 'clip_frames': io.clip_frames, 'num_frame_testing': tile[0],
              'num_frame_overlapping': overlap[0], 'size_patch_testing': tile[1], 'overlap_size': overlap[1]}
    infer_video(net, lq[:, :tile[0], :, :tile[1], :tile[1]], **kwargs)  # warm-up: one tile
    with profile_step.labels(net), profile(activities=[ProfilerActivity.CPU]) as prof:
        start = time.perf_counter()
        infer_video(net, lq, **kwargs)
        seconds = time.perf_counter() - start
    result = {'eval_s': round(seconds, 3), 'parts': profile_step.attribute(prof, 'tiling: pad, crop, blend')}
    if top:
        result['top_ops'] = top_operators(prof, 'tiling: pad, crop, blend', top)
    return result


class attached:
    """Attach ``py-spy record`` or ``perf record`` to this process for the ``with`` block; ``timing['seconds']`` is
    the block's wall time (the sampler's start-up is outside it)."""

    def __init__(self, sampler: str, out: str) -> None:
        self.sampler, self.out, self.timing = sampler, out, {'seconds': 0.0}

    def __enter__(self) -> dict[str, float]:
        pid = str(os.getpid())
        if self.sampler == 'py-spy':
            cmd = ['py-spy', 'record', '--pid', pid, '--native', '-r', '100', '-f', 'raw', '-o', self.out]
        else:
            cmd = ['perf', 'record', '-F', '250', '-p', pid, '-o', self.out]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        time.sleep(3)  # the sampler attaches
        if self.proc.poll() is not None:
            raise SystemExit(f'{cmd[0]} did not start: {self.proc.stderr.read() if self.proc.stderr else ""}')
        self.start = time.perf_counter()
        return self.timing

    def __exit__(self, *exc: object) -> None:
        self.timing['seconds'] = time.perf_counter() - self.start
        self.proc.send_signal(signal.SIGINT)
        _, err = self.proc.communicate(timeout=300)
        if self.proc.returncode not in (0, -signal.SIGINT, 130):
            raise SystemExit(f'{self.sampler} failed ({self.proc.returncode}): {err[-2000:]}')


def _library(frame: str) -> str:
    """py-spy's frame ``name (file:line)`` / ``name (lib.so)`` -> 'python' or the shared object's stem."""
    found = re.search(r'\(([^()]*)\)$', frame)
    where = found.group(1) if found else ''
    if re.search(r'\.py(:\d+)?$', where):
        return 'python'
    if where == '?':
        return 'jit'
    return where.split('.so')[0] if '.so' in where else (where or 'unknown')


def summarize_pyspy(path: str, top: int = 12) -> dict[str, Any]:
    """Shares of py-spy's samples: inside an operator (a frame in :data:`OPERATOR_LIBS`) or not, the innermost
    frame's library, and the Python functions (innermost Python frame) of the samples outside every operator."""
    inside = outside = 0
    leaf: Counter[str] = Counter()
    python_fns: Counter[str] = Counter()
    for line in Path(path).read_text().splitlines():
        stack, _, count_text = line.rpartition(' ')
        if not stack:
            continue
        count = int(count_text)
        frames = stack.split(';')
        libs = [_library(f) for f in frames]
        leaf[libs[-1]] += count
        if any(lib.startswith(OPERATOR_LIBS) for lib in libs):
            inside += count
        else:
            outside += count
            py = [f for f, lib in zip(frames, libs) if lib == 'python']
            python_fns[re.sub(r':\d+\)$', ')', py[-1]) if py else '(no Python frame)'] += count
    total = inside + outside
    return {'samples': total, 'in_operators_pct': round(100 * inside / total, 1) if total else 0.0,
            'outside_operators_pct': round(100 * outside / total, 1) if total else 0.0,
            'leaf_library_pct': {k: round(100 * v / total, 1) for k, v in leaf.most_common(top)},
            'outside_by_python_function_pct': {k: round(100 * v / total, 2) for k, v in python_fns.most_common(top)}}


def summarize_perf(path: str, top: int = 12) -> dict[str, Any]:
    """CPU-time shares by shared object from ``perf report --sort dso`` (every thread of the process)."""
    report = subprocess.run(['perf', 'report', '-i', path, '--sort', 'dso', '--stdio'], capture_output=True,
                            text=True, check=True).stdout
    shares: dict[str, float] = {}
    for line in report.splitlines():
        found = re.match(r'\s*([\d.]+)%\s+(\S+)', line)
        if found and len(shares) < top:
            shares[found.group(2)] = float(found.group(1))
    samples = re.search(r'# Samples: (\S+)', report)
    by_symbol = subprocess.run(['perf', 'report', '-i', path, '--sort', 'sym', '--stdio'], capture_output=True,
                               text=True, check=True).stdout
    kernel = re.findall(r'^\s*([\d.]+)%\s+\[k\]\s+(\S+)', by_symbol, re.M)[:6]  # page faults, wake-ups
    copies = sum(float(pct) for pct, name in re.findall(r'^\s*([\d.]+)%\s+\[\.\]\s+(.*)$', by_symbol, re.M)
                 if 'copy_kernel' in name or 'memmove' in name or 'memcpy' in name)
    events = re.search(r'# Event count \(approx\.\): (\d+)', report)  # cpu-clock: nanoseconds of CPU time
    return {'samples': samples.group(1) if samples else '?',
            'cpu_s': round(int(events.group(1)) / 1e9, 2) if events else None, 'dso_pct': shares,
            'kernel_top_pct': {name: float(pct) for pct, name in kernel}, 'copy_kernels_pct': round(copies, 2)}


# rows of the merged table (--merge): the parts of every network, grouped as the issue names them
GROUPS = {
    'attention (qkv, kernel, projection)': ('attention (qkv, kernel, projection)',),
    'MLP and norms of the transformer blocks': ('MLP, norm',),
    'window shift/partition/pad, masks': ('window shift/partition/pad, norm',),
    'deformable alignment (IART: implicit warp)': ('deformable alignment', 'alignment (IART implicit warp)'),
    'flow estimation (SpyNet)': ('flow estimation (SpyNet)',),
    'flow warping, composition': ('flow warping, composition',),
    'propagation convolutions (BasicVSR++ backbone, IART embed/residual convs)': (
        'propagation backbone (convolutions)', 'propagation transformer (embed, residual convs, norms)'),
    'reconstruction head (convolutions)': ('reconstruction head (convolutions)',),
    'other network ops, loss, tiling': ('other network ops (norms, linears, residuals)', 'propagation: stacks, layout',
                                        'loss', 'backward engine, other', 'tiling: pad, crop, blend'),
    'optimizer (Adam) and EMA update': ('optimizer (Adam)', 'EMA update'),
}


def merged_table(runs: list[dict[str, Any]]) -> str:
    """One Markdown table of several runs' JSON lines: seconds and share of the profiled time per group of parts,
    layout copies (within those groups), data loading and the wall time of the step or evaluation."""
    columns = [(r, kind) for r in runs for kind in ('train', 'eval') if kind in r['parts_ms']]
    head = ' | '.join(f"{r['net']} {r['preset']} {kind}" for r, kind in columns)
    lines = [f'| part | {head} |', '|---' * (len(columns) + 1) + '|']
    totals = [sum(d['ms'] for d in r['parts_ms'][kind].values()) for r, kind in columns]
    known = {p for parts in GROUPS.values() for p in parts}
    for group, parts in GROUPS.items():
        cells = []
        for (r, kind), total in zip(columns, totals):
            got = r['parts_ms'][kind]
            extra = [p for p in got if p not in known] if group.startswith('other') else []
            ms = sum(got[p]['ms'] for p in (*parts, *extra) if p in got)
            cells.append(f'{ms / 1e3:.2f} s ({100 * ms / total:.0f}%)' if ms else '-')
        lines.append(f"| {group} | {' | '.join(cells)} |")
    copies = [sum(d['copies_ms'] for d in r['parts_ms'][kind].values()) for r, kind in columns]
    lines.append('| of all these: layout copies (copy_, cat, stack, clone) | '
                 + ' | '.join(f'{c / 1e3:.2f} s ({100 * c / t:.0f}%)' for c, t in zip(copies, totals)) + ' |')
    lines.append('| data loading, per batch (synthetic set, main process) | '
                 + ' | '.join(f"{r['data_loading_ms']:.0f} ms" if kind == 'train' and 'data_loading_ms' in r else '-'
                              for r, kind in columns) + ' |')
    lines.append('| **total profiled (own CPU time)** | ' + ' | '.join(f'{t / 1e3:.1f} s' for t in totals) + ' |')
    lines.append('| wall time (under the profiler) | ' + ' | '.join(
        f"{r['train_step_s' if kind == 'train' else 'eval_s']:.1f} s" for r, kind in columns) + ' |')
    return '\n'.join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--net', choices=sorted(PRESETS), default='vrt')
    parser.add_argument('--preset', help='a preset of the net\'s benchmark (default: the released one, see above)')
    parser.add_argument('--frames', type=int, help='training clip frames')
    parser.add_argument('--size', type=int, nargs=2, default=(64, 64), metavar=('H', 'W'), help='training LQ size')
    parser.add_argument('--eval-frames', type=int, default=6)
    parser.add_argument('--eval-size', type=int, nargs=2, default=(96, 96))
    parser.add_argument('--eval-tile', type=int, nargs=2, default=(6, 64), help='temporal tile, spatial tile (LQ)')
    parser.add_argument('--eval-overlap', type=int, nargs=2, default=(2, 16))
    parser.add_argument('--skip', choices=('train', 'eval'), help='profile only the other one')
    parser.add_argument('--threads', type=int, default=2)
    parser.add_argument('--top-ops', type=int, default=0, metavar='N',
                        help="also give each part's N operators of most own time (JSON key top_ops)")
    parser.add_argument('--sampler', choices=('py-spy', 'perf'), help='sample training steps instead (see above)')
    parser.add_argument('--steps', type=int, default=1, help='--sampler: training steps sampled')
    parser.add_argument('--out', help='--sampler: where the samples go')
    parser.add_argument('--merge', nargs='+', metavar='LOG', help="print one table of these runs' output (each "
                        "file's last JSON line) and exit")
    args = parser.parse_args(argv)
    if args.merge:
        runs = [json.loads([ln for ln in Path(f).read_text().splitlines() if ln.startswith('{')][-1])
                for f in args.merge]
        print(merged_table(runs))  # noqa: T201
        return 0
    if args.sampler and not args.out:
        args.out = f'/tmp/profile_released_{args.net}.{"txt" if args.sampler == "py-spy" else "perf"}'
    torch.set_num_threads(args.threads)
    preset = args.preset or RELEASED[args.net]
    if preset not in PRESETS[args.net]:
        parser.error(f'--preset {preset}: {args.net} has {", ".join(PRESETS[args.net])}')

    net = build(args.net, preset)
    io = net_io(net)
    frames = io.clip_frames or args.frames or TRAIN_FRAMES[args.net]
    h, w = args.size
    gen = torch.Generator().manual_seed(0)
    results: dict[str, Any] = {'net': args.net, 'preset': preset, 'threads': torch.get_num_threads(),
                               'torch': torch.__version__, 'params': sum(p.numel() for p in net.parameters())}
    parts: dict[str, dict[str, dict[str, float]]] = {}
    top_ops: dict[str, Any] = {}
    if args.skip != 'train' or args.sampler:
        x = torch.rand(1, frames, io.in_chans, h, w, generator=gen)
        out_frames = 1 if io.frame_interpolation else frames
        y = torch.rand(1, out_frames, io.out_chans, h * io.scale, w * io.scale, generator=gen)
        train = profiled_train(net, args.net, preset, x, y, args.sampler, args.steps, args.out or '', args.top_ops)
        results['train_clip'] = [frames, h, w]
        if args.sampler:
            results.update(train)
            results[args.sampler] = (summarize_pyspy if args.sampler == 'py-spy' else summarize_perf)(args.out)
            if results[args.sampler].get('cpu_s'):  # CPU time over the wall time of the threads
                results['cores_busy_pct'] = round(100 * results[args.sampler]['cpu_s'] / (
                    results['sampled_step_s'] * args.steps * args.threads), 1)
            print(json.dumps(results), flush=True)  # noqa: T201
            return 0
        parts['train'] = train.pop('parts')
        top_ops['train'] = train.pop('top_ops', None)
        results.update(train)
        results['data_loading_ms'] = round(profile_step.data_loading_ms(io, frames, (h, w)), 1)
    if args.skip != 'eval':
        lq = torch.rand(1, io.clip_frames or args.eval_frames, io.in_chans, *args.eval_size, generator=gen)
        evaluation = profiled_eval(net, lq, tuple(args.eval_tile), tuple(args.eval_overlap), args.top_ops)
        parts['eval'] = evaluation.pop('parts')
        top_ops['eval'] = evaluation.pop('top_ops', None)
        results.update(evaluation, eval_clip=list(lq.shape[1:2]) + list(args.eval_size),
                       eval_tile=[*args.eval_tile, *args.eval_overlap])
    if args.top_ops:
        results['top_ops'] = top_ops
    results['parts_ms'] = {k: {p: {m: round(v, 1) for m, v in d.items()} for p, d in t.items()}
                           for k, t in parts.items()}
    profile_step._print_table(results, parts)
    print(json.dumps(results), flush=True)  # noqa: T201
    return 0


if __name__ == '__main__':
    sys.exit(main())
