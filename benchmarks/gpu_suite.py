"""Check and measure the CUDA path end to end in one command (longer than 10 minutes on one H100: run it in parts with
``--only`` where a lease is short; ``parity`` took 97 s and ``train`` at ``--iters 2`` 146 s for VRT 001 and 002).

Examples:
    python benchmarks/gpu_suite.py --out results/gpu_suite
    python benchmarks/gpu_suite.py --out results/gpu_suite --reference-dir /path/to/JingyunLiang/VRT
    python benchmarks/gpu_suite.py --device cpu --quick --out /tmp/suite     # the same code on tiny shapes (CI)

Sections (each timed; one that fails is reported and the others still run; sections beyond ``--budget-s`` are
skipped and say so):

* ``environment``: GPU, driver, torch, CUDA, cuDNN, the TF32/deterministic policy in force;
* ``goldens``: the VRT/RVRT reference fixtures (tests/fixtures) on the device, fp32 with TF32 off;
* ``parity``: bf16 and fp16 autocast against fp32 (same weights and input): output error, loss difference;
* ``train``: train-step time and peak memory at 1 clip per GPU for VRT 001, 002, 005, 009 and RVRT 001 (the
  option files' networks and training clips) in fp32 and bf16, beside the reference VRT when ``--reference-dir``
  is given, and beside the estimate of ``models.memory_plan``; the first step records the SDPA kernel of every
  attention call (``sdpa`` in the JSON);
* ``compile``: ``torch.compile`` of a small VRT (compile time, step time against eager);
* ``ddp``: a DDP step in an NCCL (CPU: gloo) process group of one rank, against the bare step;
* ``gan``: the GAN model's whole step (``models/model_gan.py``) with VRT 010's generator and U-Net discriminator at
  1 clip, each in its own DDP wrapper (one-rank group), perceptual loss on generated VGG19 weights, in fp32, bf16
  autocast (D's spectral norm inside it) and fp16 with one GradScaler for both optimizers: step time, peak
  memory, finite losses, spectral-norm vectors kept fp32;
* ``deterministic``: step time with ``train.deterministic`` on and off, and two deterministic runs compared bit
  for bit;
* ``metrics``: the metric networks (LPIPS, LPIPS-VGG, DISTS, tLP) at 256 x 256 and 1080p, frames batched a forward
  as evaluation does on the device against one frame a forward, and a cut clip scored as the whole
  (``benchmarks/gpu_suite_metrics.py``);
* ``tiled``: tiled-inference frames/s at 720p output (VRT 001 x4, 12 frames of 180x320 LQ, tile 40x128x128) and on
  the deblurring validation tile (VRT 005, 12 x 256 x 256 tiles, whose shifted attention needs the chunked path).

Writes ``suite.json`` and ``suite.md`` (tables for benchmarks/RESULTS.md) to ``--out`` after every section (a run
stopped from outside keeps what it finished); exits 1 when a section failed. ``--quick`` uses tiny networks and clips
(the CPU run takes well under a minute) and skips ``compile`` on the CPU (minutes to compile there).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import platform
import subprocess
import sys
import tempfile
import time
import traceback
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

from benchmarks.bench_vrt import Runner, _load_reference, measure  # noqa: E402
from benchmarks.gpu_suite_common import QUICK_CLIPS, QUICK_RVRT, QUICK_VRT, ROOT, seeded_rand, sync  # noqa: E402
from benchmarks.gpu_suite_gan import gan_section  # noqa: E402
from benchmarks.gpu_suite_metrics import metrics_section  # noqa: E402
from benchmarks.gpu_suite_report import markdown  # noqa: E402
from engine.options import parse_options  # noqa: E402
from models.layers_sdpa import record_attention_calls  # noqa: E402
from models.memory_plan import estimate_peak_memory, train_clip  # noqa: E402
from models.network_rvrt import RVRT  # noqa: E402
from models.network_vrt import VRT  # noqa: E402
from models.select_network import define_network, network_kwargs  # noqa: E402
from models.video_inference import infer_video  # noqa: E402
from utils import utils_numerics  # noqa: E402

FIXTURES = ROOT / 'tests' / 'fixtures'
AMP = {'fp32': None, 'bf16': torch.bfloat16, 'fp16': torch.float16}
RECIPES = {'vrt_001': 'options/vrt/001_train_vrt_videosr_bi_reds_6frames.json',
           'vrt_002': 'options/vrt/002_train_vrt_videosr_bi_reds_16frames.json',
           'vrt_005': 'options/vrt/005_train_vrt_videodeblurring_dvd.json',
           'vrt_009': 'options/vrt/009_train_vrt_videofi_vimeo_4frames.json',
           'rvrt_001': 'options/rvrt/001_train_rvrt_videosr_bi_reds_30frames.json'}
GOLDEN_TOLERANCE = 20, 5  # x the CPU tests' output atol / gradient tolerance (tests/test_gpu.py uses the same)


# ------------------------------------------------------------------------------------------------ helpers
class _BackwardKernels(TorchDispatchMode):
    """Counts the fused SDPA backward kernels dispatched inside it."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = str(func.overloadpacket)
        if name.startswith('aten._scaled_dot_product') and name.endswith('_backward'):
            self.counts[name.replace('aten._scaled_dot_product_', '').replace('_attention_backward', '')] += 1
        return func(*args, **(kwargs or {}))


def _kernel_summary(calls: list[dict[str, Any]], backward: Counter[str]) -> dict[str, Any]:
    return {'calls': len(calls), 'forward': dict(Counter(c['kernel'] for c in calls)),
            'trainable_bias': dict(Counter(c['kernel'] for c in calls if c['mask_grad'])),
            'backward': dict(backward), 'head_dims': sorted({c['q'][-1] for c in calls}),
            'max_folded': max((max(c['q'][:2]) for c in calls), default=0),
            'not_eligible': sum(bool(c['blockers']) for c in calls)}


class Suite:
    """Runs the sections, keeps their results and the time budget."""

    def __init__(self, args: argparse.Namespace, command: str) -> None:
        self.args = args
        self.command = command  # as suite.md quotes it
        self.device = torch.device(args.device)
        self.quick = args.quick
        self.start = time.perf_counter()
        self.results: dict[str, Any] = {}
        self.failed: list[str] = []
        self.problems: list[str] = []  # expectations a section measured as unmet (the run exits 1)

    def run(self, name: str, fn: Callable[[], Any]) -> None:
        if self.over_budget():
            elapsed = time.perf_counter() - self.start
            self.results[name] = {'status': 'skipped', 'reason': f'time budget spent ({elapsed:.0f} s)'}
            return
        t0 = time.perf_counter()
        try:
            self.results[name] = {'status': 'ok', **fn()}
        except Exception as exc:  # one broken section must not hide the others' numbers
            self.failed.append(name)
            self.results[name] = {'status': 'error', 'error': f'{type(exc).__name__}: {exc}',
                                  'traceback': traceback.format_exc(limit=6)}
        self.results[name]['seconds'] = round(time.perf_counter() - t0, 1)
        print(f'[{time.perf_counter() - self.start:6.1f} s] {name}: {self.results[name]["status"]}', flush=True)
        self.write()  # a run stopped from outside (a lease's time limit) keeps the sections it finished

    def write(self) -> dict[str, Any]:
        """``suite.json`` and ``suite.md`` in ``--out`` with the sections so far, each file replaced atomically."""
        results = {**self.results, 'total_seconds': round(time.perf_counter() - self.start, 1),
                   'failed': self.failed, 'problems': self.problems, 'quick': self.quick}
        out = Path(self.args.out)
        out.mkdir(parents=True, exist_ok=True)
        for name, text in (('suite.json', json.dumps(results, indent=1, default=str)),
                           ('suite.md', markdown(results, self.command))):
            tmp = out / f'.{name}.tmp'
            tmp.write_text(text)
            tmp.replace(out / name)
        return results

    def recipe(self, name: str) -> tuple[dict[str, Any], dict[str, Any], tuple, tuple]:
        """(netG kwargs, options, lq shape, gt shape) of a preset at 1 clip."""
        if self.quick:
            net = QUICK_VRT if name.startswith('vrt') else QUICK_RVRT
            frames, size, scale = QUICK_CLIPS[net['net_type']]
            opt = {'netG': net, 'datasets': {'train': {'dataset_type': 'synthetic', 'num_frame': frames,
                                                       'gt_size': size * scale, 'scale': scale,
                                                       'dataloader_batch_size': 1}},
                   'train': {'deterministic': False, 'amp': 'none', 'E_decay': 0}}
        else:
            opt = parse_options(str(ROOT / RECIPES[name]))
            opt = copy.deepcopy(opt) | {'train': {**opt['train'], 'deterministic': False}}
        lq, gt = train_clip(opt)
        kwargs = {**network_kwargs(opt['netG']), 'net_type': opt['netG']['net_type'], 'spynet_path': None}
        return kwargs, opt, lq, gt

    def over_budget(self) -> bool:
        return time.perf_counter() - self.start > self.args.budget_s

    def presets(self, full: list[str], quick: list[str]) -> list[str]:
        return quick if self.quick else full

    def precisions(self, name: str, full: tuple[str, ...], timed: bool = False) -> tuple[str, ...]:
        """On the CPU in quick mode: fp16 autocast is left out (no fast CPU kernels), RVRT runs fp32 only, and a
        ``timed`` VRT bf16 row only on a CPU with native bf16 (elsewhere bf16 is emulated, 30-60x slower)."""
        if not (self.quick and self.device.type == 'cpu'):
            return full
        bf16 = name.startswith('vrt') and (not timed or utils_numerics.cpu_has_native_bf16())
        return tuple(p for p in full if p == 'fp32' or (p == 'bf16' and bf16))

    def build(self, kwargs: dict[str, Any], seed: int = 0) -> nn.Module:
        torch.manual_seed(seed)
        return define_network(kwargs['net_type'], {k: v for k, v in kwargs.items() if k != 'net_type'}).to(
            self.device)


# ----------------------------------------------------------------------------------------------- sections
def environment(s: Suite) -> dict[str, Any]:
    before = utils_numerics.current_state()
    policy = utils_numerics.apply_policy(deterministic=False, tf32=False, device=s.device)
    env = {'device': str(s.device), 'torch': torch.__version__, 'cuda_runtime': torch.version.cuda,
           'cudnn': torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
           'python': platform.python_version(), 'cpu_threads': torch.get_num_threads(),
           'policy': {k: policy[k] for k in ('deterministic', 'tf32', 'cudnn_benchmark', 'cublas_workspace')},
           'float32_matmul_precision': torch.get_float32_matmul_precision()}
    utils_numerics.restore_state(before)
    if s.device.type == 'cuda':
        props = torch.cuda.get_device_properties(s.device)
        env.update(gpu=props.name, capability=f'{props.major}.{props.minor}', gpus=torch.cuda.device_count(),
                   memory_gb=round(props.total_memory / 2**30, 1))
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            env['driver'] = subprocess.run(['nvidia-smi', '--query-gpu=driver_version', '--format=csv,noheader'],
                                           capture_output=True, text=True, timeout=20).stdout.strip().splitlines()[0]
    else:
        env['cpu'] = platform.processor() or platform.machine()
    return env


def goldens(s: Suite) -> dict[str, Any]:
    from tests.support.golden import RVRT_GOLDEN, VRT_GOLDEN, deterministic_fill
    cases = [('vrt', c) for c in sorted(VRT_GOLDEN)] + [('rvrt', c) for c in sorted(RVRT_GOLDEN)]
    if s.quick:
        cases = [('vrt', 'small_1frame')]  # the cheapest on a CPU (the others take 3-60 s each there)
    rows = []
    before = utils_numerics.current_state()
    utils_numerics.apply_policy(deterministic=False, tf32=False, device=s.device)
    try:
        for kind, case in cases:
            atol, grad_rel = (VRT_GOLDEN if kind == 'vrt' else RVRT_GOLDEN)[case]
            atol, grad_rel = max(GOLDEN_TOLERANCE[0] * atol, 1e-5), max(GOLDEN_TOLERANCE[1] * grad_rel, 2e-3)
            data = torch.load(FIXTURES / kind / f'golden_{case}.pt', weights_only=True)
            torch.manual_seed(0)
            net = (VRT if kind == 'vrt' else RVRT)(**data['config'])
            deterministic_fill(net, data['fill_seed'])
            net = net.to(s.device)
            if kind == 'vrt':
                x, ref = data['input'], data['output']
            else:
                x = torch.rand(data['input_shape'], generator=torch.Generator().manual_seed(data['input_seed']))
                ref = data['output_sub']
            out = net(x.to(s.device))
            got = out.detach().cpu() if kind == 'vrt' else out.detach()[..., ::2, ::2].cpu()
            out.square().mean().backward()
            params = dict(net.named_parameters())
            grad_err = max(float((params[n].grad.cpu() - g).abs().max() / g.abs().max().clamp_min(1e-12))
                           for n, g in data['grads'].items())
            out_err = float((got - ref).abs().max())
            rows.append({'net': kind, 'case': case, 'output_err': out_err, 'output_tol': atol, 'grad_rel_err': grad_err,
                         'grad_tol': grad_rel, 'ok': out_err <= atol and grad_err <= grad_rel})
    finally:
        utils_numerics.restore_state(before)
    if not all(r['ok'] for r in rows):
        raise AssertionError(f'golden mismatch: {[r for r in rows if not r["ok"]]}')
    return {'rows': rows}


def _step(net: nn.Module, x: torch.Tensor, y: torch.Tensor, amp: torch.dtype | None,
          scaler: torch.amp.GradScaler | None = None) -> float:
    net.zero_grad(set_to_none=True)
    with torch.autocast(x.device.type, dtype=amp, enabled=amp is not None):
        out = net(x)
    loss = torch.sqrt((out.float() - y) ** 2 + 1e-9).mean()
    (scaler.scale(loss) if scaler is not None else loss).backward()
    return float(loss.detach())


def parity(s: Suite) -> dict[str, Any]:
    rows = []
    for name in s.presets(['vrt_001', 'rvrt_001'], ['vrt_001']):
        kwargs, _, lq, gt = s.recipe(name)
        if not s.quick and name == 'rvrt_001':
            lq, gt = (4, *lq[1:]), (4, *gt[1:])  # 4 frames are enough for a numerical comparison
        net = s.build(kwargs)
        x, y = seeded_rand((1, *lq), s.device, 1), seeded_rand((1, *gt), s.device, 2)
        with torch.no_grad():
            ref = net.eval()(x).float()
        loss32 = _step(net.train(), x, y, None)
        for precision in s.precisions(name, ('bf16', 'fp16')):
            with torch.no_grad(), torch.autocast(s.device.type, dtype=AMP[precision]):
                out = net.eval()(x).float()
            scaler = torch.amp.GradScaler(s.device.type) if precision == 'fp16' else None
            loss = _step(net.train(), x, y, AMP[precision], scaler)
            finite = all(torch.isfinite(p.grad).all() for p in net.parameters() if p.grad is not None)
            err = float((out - ref).abs().max() / ref.abs().max())
            psnr = float(10 * torch.log10(1 / ((out.clamp(0, 1) - ref.clamp(0, 1)) ** 2).mean().clamp_min(1e-12)))
            rows.append({'preset': name, 'precision': precision, 'output_rel_err': err, 'psnr_vs_fp32_db': psnr,
                         'loss_rel_diff': abs(loss - loss32) / loss32, 'grads_finite': bool(finite)})
    return {'rows': rows}


def train(s: Suite) -> dict[str, Any]:
    names = s.presets(list(RECIPES), ['vrt_001', 'rvrt_001'])
    reference = _load_reference(s.args.reference_dir) if s.args.reference_dir else None
    rows, kernels = [], {}
    iters, warmup = (1, 0) if s.quick else (s.args.iters, 1)
    for name in names:
        kwargs, opt, lq, gt = s.recipe(name)
        x, y = seeded_rand((1, *lq), s.device, 1), seeded_rand((1, *gt), s.device, 2)
        for precision in s.precisions(name, ('fp32', 'bf16'), timed=True):
            if s.over_budget():
                rows.append({'preset': name, 'precision': precision, 'impl': 'ours', 'error': 'skipped: time budget'})
                continue
            ours = s.build(kwargs)
            nets = {'ours': ours}
            if reference is not None and kwargs['net_type'] == 'vrt':
                ref_kwargs = {k: list(v) if isinstance(v, tuple) else v for k, v in kwargs.items() if k != 'net_type'}
                try:
                    ref = reference(**ref_kwargs).to(s.device)
                    ref.load_state_dict(ours.state_dict(), strict=True)
                    nets['reference'] = ref
                except Exception as exc:  # a setting the reference cannot build: ours is still measured
                    rows.append({'preset': name, 'precision': precision, 'impl': 'reference', 'error': str(exc)[:300]})
            runners = {k: Runner(n, x, y, 'none' if precision == 'fp32' else precision) for k, n in nets.items()}
            backward = _BackwardKernels()
            with record_attention_calls() as calls, backward:
                runners['ours'].train_step()  # first step: kernels (and the optimizer state) in place
            kernels[f'{name}/{precision}'] = _kernel_summary(calls, backward.counts)
            estimate = estimate_peak_memory(opt, s.device, 'none' if precision == 'fp32' else precision, 1, 1)
            for impl, runner in runners.items():
                try:
                    m = measure({impl: runner}, warmup, iters, memory=False)[impl]
                    peak = _peak_gb(runner, s.device)
                except Exception as exc:  # e.g. the reference under bf16 autocast
                    rows.append({'preset': name, 'precision': precision, 'impl': impl, 'error': str(exc)[:300]})
                    continue
                rows.append({'preset': name, 'clip': 'x'.join(map(str, lq)), 'precision': precision, 'impl': impl,
                             'train_step_s': m['train_step_s'], 'forward_s': m['forward_s'], 'peak_gb': peak,
                             'plan_gb': round(estimate.total, 3) if impl == 'ours' else None})
            del runners, nets, ours
            if s.device.type == 'cuda':
                torch.cuda.empty_cache()
    for row in rows:  # ours against the reference, same preset and precision
        ref = next((r for r in rows if r['impl'] == 'reference' and r['preset'] == row['preset']
                    and r['precision'] == row['precision'] and 'train_step_s' in r), None)
        if row['impl'] == 'ours' and ref is not None and 'train_step_s' in row:
            row['speedup'] = round(ref['train_step_s'] / row['train_step_s'], 3)
            if ref.get('peak_gb') and row.get('peak_gb'):
                row['mem_ratio'] = round(row['peak_gb'] / ref['peak_gb'], 3)
    if s.device.type == 'cuda':
        for run, summary in kernels.items():
            if summary['forward'].get('math') or summary['not_eligible']:
                s.problems.append(f'{run}: attention calls on the math kernel or not eligible for the fused ones: '
                                  f'{summary}')
    return {'rows': rows, 'sdpa': kernels}


def _peak_gb(runner: Runner, device: torch.device) -> float | None:
    """Allocator peak of one train step (parameters and optimizer state included), CUDA only."""
    if device.type != 'cuda':
        return None
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    runner.train_step()
    return round(torch.cuda.max_memory_allocated(device) / 2**30, 3)


def compile_section(s: Suite) -> dict[str, Any]:
    if s.quick and s.device.type == 'cpu':
        return {'skipped': 'torch.compile is measured on CUDA (compiling takes minutes on a small CPU)'}
    kwargs = {**QUICK_VRT, 'img_size': [6, 64, 64], 'window_size': [6, 8, 8]}
    x, y = seeded_rand((1, 6, 3, 64, 64), s.device, 1), seeded_rand((1, 6, 3, 256, 256), s.device, 2)
    eager = Runner(s.build(kwargs), x, y, 'bf16')
    compiled_net = torch.compile(s.build(kwargs))
    compiled = Runner(compiled_net, x, y, 'bf16')
    t0 = time.perf_counter()
    compiled.train_step()
    compile_s = time.perf_counter() - t0
    m = measure({'eager': eager, 'compiled': compiled}, 1, s.args.iters, memory=False)
    return {'preset': 'vrt small (6x64x64, bf16)', 'compile_s': round(compile_s, 1),
            'eager_step_s': m['eager']['train_step_s'], 'compiled_step_s': m['compiled']['train_step_s'],
            'speedup': round(m['eager']['train_step_s'] / m['compiled']['train_step_s'], 3)}


def ddp_section(s: Suite) -> dict[str, Any]:
    kwargs, _, lq, gt = s.recipe('vrt_001')
    x, y = seeded_rand((1, *lq), s.device, 1), seeded_rand((1, *gt), s.device, 2)
    backend = 'nccl' if s.device.type == 'cuda' else 'gloo'
    with tempfile.TemporaryDirectory() as tmp:
        extra = {'device_id': s.device} if backend == 'nccl' else {}
        dist.init_process_group(backend, init_method=f'file://{tmp}/store', rank=0, world_size=1, **extra)
        try:
            amp = 'bf16' if s.device.type == 'cuda' else 'none'
            bare = Runner(s.build(kwargs), x, y, amp)
            net = s.build(kwargs)
            wrapped = nn.parallel.DistributedDataParallel(
                net, device_ids=[s.device.index or 0] if s.device.type == 'cuda' else None, forward_sync_buffers=False)
            ddp = Runner(wrapped, x, y, amp)
            iters, warmup = (1, 0) if s.quick else (s.args.iters, 1)
            m = measure({'bare': bare, 'ddp': ddp}, warmup, iters, memory=False)
        finally:
            dist.destroy_process_group()
    return {'backend': backend, 'world_size': 1, 'bare_step_s': m['bare']['train_step_s'],
            'ddp_step_s': m['ddp']['train_step_s'],
            'overhead': round(m['ddp']['train_step_s'] / m['bare']['train_step_s'] - 1, 3)}


def deterministic_section(s: Suite) -> dict[str, Any]:
    rows = []
    before = utils_numerics.current_state()
    try:
        for name in s.presets(['vrt_001', 'rvrt_001'], ['vrt_001']):
            kwargs, _, lq, gt = s.recipe(name)
            if not s.quick and name == 'rvrt_001':
                lq, gt = (6, *lq[1:]), (6, *gt[1:])
            x, y = seeded_rand((1, *lq), s.device, 1), seeded_rand((1, *gt), s.device, 2)
            row = {'preset': name, 'clip': 'x'.join(map(str, lq))}
            for mode in (False, True):
                utils_numerics.apply_policy(deterministic=mode, tf32=False, device=s.device)
                finals = []
                for _ in range(2 if mode else 1):
                    runner = Runner(s.build(kwargs), x, y, 'none')
                    times = [runner.train_step() for _ in range(1 if s.quick else 3)]
                    finals.append([p.detach().clone() for p in runner.net.parameters()])
                row['deterministic_step_s' if mode else 'default_step_s'] = round(min(times), 4)
                if mode:
                    row['bit_identical'] = all(torch.equal(a, b) for a, b in zip(*finals))
            rows.append(row)
    finally:
        utils_numerics.restore_state(before)
    if not all(r['bit_identical'] for r in rows):
        raise AssertionError(f'deterministic runs differ: {rows}')
    return {'rows': rows}


def tiled(s: Suite) -> dict[str, Any]:
    from models.model_zoo import TASKS
    rows = []
    if s.quick:
        jobs = [('vrt quick', {k: v for k, v in QUICK_VRT.items() if k != 'net_type'}, 1, (2, 4, 4), (3, 44, 48),
                 (2, 40, 40), False)]
    else:
        jobs = [('vrt_001 720p x4', TASKS['001_VRT_videosr_bi_REDS_6frames'].net_kwargs(), 4, (6, 8, 8),
                 (12, 180, 320), (40, 128, 128), False),
                ('vrt_005 deblur 12x256x256 tiles', TASKS['005_VRT_videodeblurring_DVD'].net_kwargs(), 1, (6, 8, 8),
                 (12, 720, 1280), (12, 256, 256), False)]
    for label, kwargs, scale, window, (frames, h, w), tile, _ in jobs:
        net = VRT(**kwargs).to(s.device).eval()
        lq = torch.rand(1, frames, 3, h, w, generator=torch.Generator().manual_seed(0))
        for precision in (('bf16',) if not s.quick else ('fp32',)):
            if s.over_budget():
                rows.append({'job': label, 'precision': precision, 'skipped': 'time budget spent'})
                continue
            if s.device.type == 'cuda':
                torch.cuda.reset_peak_memory_stats(s.device)
            sync(s.device)
            t0 = time.perf_counter()
            out = infer_video(net, lq, scale=scale, window_size=window, num_frame_testing=tile[0],
                              num_frame_overlapping=1 if s.quick else 2, size_patch_testing=tile[1],
                              overlap_size=20,
                              device=s.device, autocast_dtype=AMP[precision])
            sync(s.device)
            seconds = time.perf_counter() - t0
            rows.append({'job': label, 'precision': precision, 'lq': f'{frames}x{h}x{w}',
                         'tile': 'x'.join(map(str, tile)), 'out': 'x'.join(map(str, out.shape[-2:])),
                         'seconds': round(seconds, 2),
                         'frames_per_s': round(frames / seconds, 3), 'finite': bool(torch.isfinite(out).all()),
                         'peak_gb': round(torch.cuda.max_memory_allocated(s.device) / 2**30, 2)
                         if s.device.type == 'cuda' else None})
        del net
    return {'rows': rows}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--device', default='cuda' if torch.cuda.is_available() else 'cpu')
    parser.add_argument('--quick', action='store_true', help='tiny networks and clips (CI)')
    parser.add_argument('--out', default='results/gpu_suite', help='folder for suite.json and suite.md')
    parser.add_argument('--reference-dir', help='checkout of the reference VRT (its models/network_vrt.py)')
    parser.add_argument('--iters', type=int, default=3, help='timed iterations per measurement')
    parser.add_argument('--budget-s', type=float, default=540.0, help='sections starting later are skipped')
    parser.add_argument('--only', nargs='+', help='run only these sections')
    parser.add_argument('--threads', type=int, help='torch.set_num_threads (default: 1 for --quick on the CPU)')
    args = parser.parse_args(argv)
    utils_numerics.prepare_environment(True)  # CUBLAS_WORKSPACE_CONFIG before cuBLAS starts (deterministic section)
    if args.threads or (args.quick and args.device == 'cpu'):
        torch.set_num_threads(args.threads or 1)  # many small kernels: more threads only oversubscribe
    if args.device.startswith('cuda') and not torch.cuda.is_available():
        print('error: no CUDA device; use --device cpu --quick for the CPU run', file=sys.stderr)
        return 2
    if args.device == 'cuda':
        args.device = 'cuda:0'
    suite = Suite(args, 'python benchmarks/gpu_suite.py ' + ' '.join(argv if argv is not None else sys.argv[1:]))
    sections = {'environment': environment, 'goldens': goldens, 'parity': parity, 'train': train,
                'ddp': ddp_section, 'gan': gan_section, 'deterministic': deterministic_section, 'tiled': tiled,
                'metrics': metrics_section, 'compile': compile_section}
    before = utils_numerics.current_state()
    # the training defaults but deterministic mode (the deterministic section measures both): TF32 off, cuDNN
    # autotuning on
    utils_numerics.apply_policy(deterministic=False, tf32=False, device=suite.device)
    try:
        for name, fn in sections.items():
            if not args.only or name in args.only:
                suite.run(name, lambda fn=fn: fn(suite))
    finally:
        utils_numerics.restore_state(before)
    results = suite.write()
    out = Path(args.out)
    print(f'wrote {out / "suite.json"} and {out / "suite.md"} ({results["total_seconds"]} s)')
    for problem in suite.problems:
        print(f'problem: {problem}', file=sys.stderr)
    return 1 if suite.failed or suite.problems else 0


if __name__ == '__main__':
    sys.exit(main())
