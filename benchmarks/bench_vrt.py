"""VRT speed/memory benchmark: forward time, train-step time, peak memory and samples/s as JSON lines.

Examples:
    python benchmarks/bench_vrt.py --preset tiny --iters 5
    python benchmarks/bench_vrt.py --preset tiny --reference-dir /tmp/ref/JingyunLiang+VRT   # side by side
    python benchmarks/bench_vrt.py --preset tiny --baseline HEAD~3    # ours before/after a change, one process
    python benchmarks/bench_vrt.py --opt options/vrt/001_train_vrt_videosr_bi_reds_6frames.json --device cuda \
        --amp bf16 --batch 1

A train step is: forward, Charbonnier loss mean(sqrt((x - y)^2 + eps)), backward, Adam step. With
``--reference-dir`` the reference ``models/network_vrt.py`` of that directory (never part of this project) is
imported, given the same weights, and timed alternately with ours in the same process. With ``--baseline REV``
this project's own network at git revision REV (its ``models/`` and ``utils/`` extracted to a scratch directory
and imported under their usual names, then put aside) is timed beside the working tree's, in the same process.
On CUDA the peak memory is
``max_memory_allocated`` over one train step; on CPU the same count, the peak bytes of the tensor storages the step
creates (:class:`LiveTensorBytes`: no allocator caching or fragmentation). Both leave out what existed before the
step (weights, optimizer state).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import importlib.util
import json
import subprocess
import sys
import tempfile
import time
import weakref
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402
from torch.utils._pytree import tree_leaves  # noqa: E402

from models.model_zoo import TASKS  # noqa: E402
from models.net_io import net_io  # noqa: E402
from models.network_vrt import VRT  # noqa: E402
from models.select_network import network_kwargs  # noqa: E402
from utils import utils_numerics  # noqa: E402

PRESETS: dict[str, dict[str, Any]] = {
    'tiny': {'upscale': 4, 'img_size': (6, 64, 64), 'window_size': (6, 8, 8), 'depths': (2,) * 7 + (2,) * 6,
             'indep_reconsts': (11, 12), 'embed_dims': (24,) * 7 + (36,) * 6, 'num_heads': (3,) * 13,
             'pa_frames': 2, 'deformable_groups': 4},
    'small': {'upscale': 4, 'img_size': (6, 64, 64), 'window_size': (6, 8, 8), 'depths': (4,) * 7 + (2,) * 6,
              'indep_reconsts': (11, 12), 'embed_dims': (48,) * 7 + (72,) * 6, 'num_heads': (6,) * 13,
              'pa_frames': 2, 'deformable_groups': 8},
    # the released models' constructor settings (001..009)
    **{name[:3]: spec.net_kwargs() for name, spec in TASKS.items() if spec.net_type == 'vrt'},
}


def _kwargs_from_opt(path: str) -> dict[str, Any]:
    """netG constructor kwargs of an option file (our parser if present, else a plain comment-stripping load)."""
    try:
        from utils.utils_option import load_json
        tree = load_json(path)
    except ImportError:
        import re
        text = re.sub(r'(?m)^\s*//.*$', '', Path(path).read_text())
        tree = json.loads(text)
    net = tree['netG']
    if net.get('net_type', 'vrt').lower() != 'vrt':
        raise SystemExit(f"{path}: netG.net_type is {net.get('net_type')!r}; this benchmark is for VRT")
    return network_kwargs(net)


def _load_reference(directory: str) -> type[nn.Module]:
    """Import ``DIR/models/network_vrt.py`` (or ``DIR/network_vrt.py``) under a private module name."""
    root = Path(directory)
    path = next((p for p in (root / 'models' / 'network_vrt.py', root / 'network_vrt.py') if p.is_file()), None)
    if path is None:
        raise SystemExit(f'--reference-dir {directory}: no models/network_vrt.py or network_vrt.py in it')
    spec = importlib.util.spec_from_file_location('_reference_network_vrt', path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.VRT


def load_baseline(rev: str, module: str, name: str) -> Any:
    """``module.name`` (e.g. ``models.network_vrt``, ``VRT``) from this repository at git revision ``rev``.

    The revision's ``models/`` and ``utils/`` are extracted to a scratch directory and imported under their own
    names while the working tree's modules are set aside; afterwards the working tree's modules are put back, so
    both versions live in one process (each keeps the module globals it was imported with).
    """
    root = Path(__file__).resolve().parents[1]
    target = Path(tempfile.gettempdir()) / f'bench_baseline_{rev.replace("/", "_").replace("~", "-")}'
    target.mkdir(exist_ok=True)
    archive = subprocess.run(['git', '-C', str(root), 'archive', rev, 'models', 'utils'], check=True,
                             capture_output=True).stdout
    subprocess.run(['tar', '-x', '-C', str(target)], input=archive, check=True)
    packages = ('models', 'utils')
    saved = {k: v for k, v in sys.modules.items() if k.split('.')[0] in packages}
    for key in saved:
        del sys.modules[key]
    sys.path.insert(0, str(target))
    try:
        return getattr(importlib.import_module(module), name)
    finally:
        sys.path.remove(str(target))
        for key in [k for k in sys.modules if k.split('.')[0] in packages]:
            del sys.modules[key]
        sys.modules.update(saved)


def _charbonnier(x: torch.Tensor, y: torch.Tensor, eps: float = 1e-9) -> torch.Tensor:
    return torch.sqrt((x - y) ** 2 + eps).mean()


def _sync(device: torch.device) -> None:
    if device.type == 'cuda':
        torch.cuda.synchronize(device)


class Runner:
    """One network, its optimizer and fixed data; times forward passes and train steps (under the numerics policy
    of ``train.deterministic = deterministic`` when that is not None)."""

    def __init__(self, net: nn.Module, x: torch.Tensor, y: torch.Tensor, amp: str,
                 deterministic: bool | None = None) -> None:
        self.net, self.x, self.y = net, x, y
        self.deterministic = deterministic
        self.opt = torch.optim.Adam(net.parameters(), lr=1e-4, betas=(0.9, 0.99))
        self.dtype = {'bf16': torch.bfloat16, 'fp16': torch.float16}.get(amp)
        self.scaler = torch.amp.GradScaler(x.device.type, enabled=amp == 'fp16')

    def _autocast(self):
        return torch.autocast(self.x.device.type, dtype=self.dtype, enabled=self.dtype is not None)

    @contextlib.contextmanager
    def _mode(self):
        before = utils_numerics.current_state()
        if self.deterministic is not None:  # the policy training applies for train.deterministic
            utils_numerics.apply_policy(self.deterministic, tf32=False, device=self.x.device)
        try:
            yield
        finally:
            utils_numerics.restore_state(before)

    def forward(self) -> float:
        with self._mode():
            return self._forward()

    def train_step(self) -> float:
        with self._mode():
            return self._train_step()

    def _forward(self) -> float:
        self.net.eval()
        _sync(self.x.device)
        start = time.perf_counter()
        with torch.no_grad(), self._autocast():
            self.net(self.x)
        _sync(self.x.device)
        return time.perf_counter() - start

    def _train_step(self) -> float:
        self.net.train()
        _sync(self.x.device)
        start = time.perf_counter()
        self.opt.zero_grad(set_to_none=True)
        with self._autocast():
            out = self.net(self.x)
        loss = _charbonnier(out.float(), self.y)
        self.scaler.scale(loss).backward()
        self.scaler.step(self.opt)
        self.scaler.update()
        _sync(self.x.device)
        return time.perf_counter() - start


class LiveTensorBytes(TorchDispatchMode):
    """Peak bytes of live tensor storages created inside the mode (what ``torch.cuda.max_memory_allocated`` counts
    on a GPU, here on the CPU: no allocator caching or fragmentation). An output on the storage of one of the op's
    inputs (in place, ``out=``, a view) is no new memory: the optimizer's in-place steps on the weights and their
    states were counted as if allocated."""

    def __init__(self) -> None:
        super().__init__()
        self.live: dict[int, int] = {}
        self.current = self.peak = 0

    def _free(self, key: int) -> None:
        self.current -= self.live.pop(key, 0)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        out = func(*args, **(kwargs or {}))
        inputs = None  # the input storages, gathered only for an output not seen yet
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.device.type != 'meta':
                storage = t.untyped_storage()
                key = storage.data_ptr()
                if not key or key in self.live:
                    continue
                if inputs is None:
                    inputs = {a.untyped_storage().data_ptr() for a in tree_leaves((args, kwargs))
                              if isinstance(a, torch.Tensor) and a.device.type != 'meta'}
                if key not in inputs:
                    self.live[key] = storage.nbytes()
                    self.current += storage.nbytes()
                    self.peak = max(self.peak, self.current)
                    weakref.finalize(storage, self._free, key)
        return out


def _peak_memory_mb(runner: Runner, steps: int) -> float:
    """Peak extra memory of ``steps`` train steps (MiB): the CUDA allocator's peak, on the CPU the peak of the live
    tensor bytes they create, in this process (a forked child's first parallel region would wait forever for the
    parent's GNU OpenMP threads, which a fork leaves behind)."""
    device = runner.x.device
    if device.type == 'cuda':
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
        for _ in range(steps):
            runner.train_step()
        return (torch.cuda.max_memory_allocated(device) - base) / 2**20
    with LiveTensorBytes() as tracker:
        for _ in range(steps):
            runner.train_step()
    return tracker.peak / 2**20


def add_run_args(parser: argparse.ArgumentParser, compile_help: str, iters: int) -> None:
    """The options every network benchmark takes: device, precision, compile, iterations, input size, threads."""
    parser.add_argument('--device', default='cuda' if torch.cuda.is_available() else 'cpu')
    parser.add_argument('--amp', default='none', choices=('none', 'bf16', 'fp16'))
    parser.add_argument('--compile', action='store_true', help=compile_help)
    parser.add_argument('--iters', type=int, default=iters, help='timed iterations (after --warmup)')
    parser.add_argument('--warmup', type=int, default=1)
    parser.add_argument('--batch', type=int, default=1)
    parser.add_argument('--frames', type=int, help='input frames')
    parser.add_argument('--size', type=int, nargs=2, metavar=('H', 'W'), help='LQ size')
    parser.add_argument('--threads', type=int, help='torch.set_num_threads on CPU')
    parser.add_argument('--no-memory', action='store_true', help='skip the peak-memory measurement')


def measure(runners: dict[str, Runner], warmup: int, iters: int, memory: bool) -> dict[str, dict[str, float]]:
    """Median forward and train-step seconds and peak memory (MiB, NaN when skipped) of each runner.

    The runners alternate inside each iteration so that all of them see the same machine load.
    """
    for runner in runners.values():
        for _ in range(warmup):
            runner.forward()
            runner.train_step()
    times: dict[str, dict[str, list[float]]] = {n: {'fwd': [], 'step': []} for n in runners}
    for _ in range(iters):
        for name, runner in runners.items():
            times[name]['fwd'].append(runner.forward())
            times[name]['step'].append(runner.train_step())
    return {name: {'forward_s': sorted(t['fwd'])[iters // 2], 'train_step_s': sorted(t['step'])[iters // 2],
                   'peak_mem_mb': _peak_memory_mb(runners[name], 1) if memory else float('nan')}
            for name, t in times.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    src = parser.add_mutually_exclusive_group()
    src.add_argument('--opt', help='KAIR-style option file whose netG is benchmarked (input: its img_size)')
    src.add_argument('--preset', default='tiny', choices=sorted(PRESETS))
    add_run_args(parser, 'torch.compile our network', iters=5)
    parser.add_argument('--reference-dir', help='directory with the reference models/network_vrt.py to compare')
    parser.add_argument('--baseline', metavar='REV', help='also time this repository\'s VRT at git revision REV')
    parser.add_argument('--deterministic', choices=('on', 'off', 'both'),
                        help="torch.use_deterministic_algorithms during the measurement; 'both' times our network "
                             "with and without it, alternately")
    args = parser.parse_args(argv)

    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    kwargs = _kwargs_from_opt(args.opt) if args.opt else dict(PRESETS[args.preset])
    kwargs['spynet_path'] = None  # weights do not matter for timing
    d, h, w = kwargs.get('img_size', (6, 64, 64))
    d = args.frames or d
    h, w = args.size or (h, w)
    torch.manual_seed(0)
    ours = VRT(**kwargs).to(device)
    io = net_io(ours)  # channels, scale and output frames are what the network states
    d = io.clip_frames or d  # frame interpolation reads exactly its clip
    gen = torch.Generator().manual_seed(0)
    x = torch.rand(args.batch, d, io.in_chans, h, w, generator=gen).to(device)
    out_frames = 1 if io.frame_interpolation else d
    y = torch.rand(args.batch, out_frames, io.out_chans, h * io.scale, w * io.scale, generator=gen).to(device)
    nets: dict[str, nn.Module] = {'ours': ours}
    if args.reference_dir:
        ref_cls = _load_reference(args.reference_dir)
        ref_kwargs = {k: list(v) if isinstance(v, tuple) else v for k, v in kwargs.items()}
        reference = ref_cls(**ref_kwargs).to(device)
        reference.load_state_dict(ours.state_dict(), strict=True)
        nets['reference'] = reference
    if args.baseline:
        baseline = load_baseline(args.baseline, 'models.network_vrt', 'VRT')(**kwargs).to(device)
        baseline.load_state_dict(ours.state_dict(), strict=True)
        nets['baseline'] = baseline
    if args.compile:
        nets['ours'] = torch.compile(ours)
    modes = {'on': [True], 'off': [False], 'both': [True, False], None: [None]}[args.deterministic]
    runners = {}
    for name, net in nets.items():
        for mode in modes:
            label = name if mode is None else f"{name}-deterministic-{'on' if mode else 'off'}"
            runners[label] = Runner(copy.deepcopy(net) if len(modes) > 1 else net, x, y, args.amp, mode)

    common = {'preset': None if args.opt else args.preset, 'opt': args.opt, 'device': str(device),
              'amp': args.amp, 'compile': args.compile, 'batch': args.batch, 'frames': d, 'lq_size': [h, w],
              'threads': torch.get_num_threads(), 'torch': torch.__version__,
              'params': sum(p.numel() for p in ours.parameters())}
    results = {}
    for name, m in measure(runners, args.warmup, args.iters, not args.no_memory).items():
        results[name] = {'impl': name, **common, 'forward_s': round(m['forward_s'], 4),
                         'train_step_s': round(m['train_step_s'], 4), 'peak_mem_mb': round(m['peak_mem_mb'], 1),
                         'train_samples_per_s': round(args.batch / m['train_step_s'], 3)}
        print(json.dumps(results[name]), flush=True)
    if 'baseline' in results:
        r, o = results['baseline'], results['ours']
        print(json.dumps({'speedup_vs_baseline_train_step': round(r['train_step_s'] / o['train_step_s'], 3),
                          'speedup_vs_baseline_forward': round(r['forward_s'] / o['forward_s'], 3)}), flush=True)
    if 'reference' in results:
        r, o = results['reference'], results['ours']
        print(json.dumps({'speedup_train_step': round(r['train_step_s'] / o['train_step_s'], 3),
                          'speedup_forward': round(r['forward_s'] / o['forward_s'], 3),
                          'peak_mem_ratio': round(o['peak_mem_mb'] / r['peak_mem_mb'], 3)
                          if r['peak_mem_mb'] == r['peak_mem_mb'] and r['peak_mem_mb'] > 0 else None}), flush=True)
    return 0


if __name__ == '__main__':
    sys.exit(main())
