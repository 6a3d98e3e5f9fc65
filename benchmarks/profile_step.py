"""Where the time goes: one training step and one tiled evaluation of VRT, RVRT or BasicVSR++, by part of the network.

Examples:
    python benchmarks/profile_step.py --net vrt --preset tiny --threads 2
    python benchmarks/profile_step.py --net vrt --preset 001 --frames 6 --size 64 64 --threads 2 --eval-frames 6
    python benchmarks/profile_step.py --net basicvsrpp --preset c64n7 --threads 2 --trace /tmp/bvpp.json

The step is what training runs: forward, Charbonnier loss, backward, Adam and an EMA update (decay 0.999), with
the network in train mode; the evaluation is :func:`models.video_inference.infer_video` with temporal and spatial
tiles. Both run once to warm up, then once under ``torch.profiler``. Every operator's own time is given to the part
of the network it ran in: forward operators to the innermost labelled module or function around them (labels are
set by wrapping forwards and a few functions for the profile only), backward operators to the part whose forward
operator created their autograd node (matched by the autograd sequence number), recomputation under activation
checkpointing to the part it recomputes. ``of which copies`` is the part's time in ``copy_``/``cat``/``stack``/
``clone`` (layout changes and concatenations). Data loading is timed apart: a batch of the synthetic training set at
the same clip size, loaded in the main process (with DataLoader workers it overlaps the step).

On ``--device cuda`` each operator's time is the GPU time of the kernels it launched (``self_device_time_total``)
and the step is timed between two synchronisations; ``--amp bf16`` runs the forward and loss under autocast.

Prints a Markdown table and one JSON line. ``--trace`` writes a Chrome trace of the profiled step.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from torch import nn  # noqa: E402
from torch.profiler import ProfilerActivity, profile, record_function  # noqa: E402

from benchmarks.bench_basicvsrpp import PRESETS as BVPP_PRESETS  # noqa: E402
from benchmarks.bench_rvrt import PRESETS as RVRT_PRESETS  # noqa: E402
from benchmarks.bench_vrt import PRESETS as VRT_PRESETS  # noqa: E402
from models import (  # noqa: E402
    layers_attention,
    layers_deform_conv,
    layers_guided_deform_attn,
    network_basicvsrpp,
    network_iart,
    network_rvrt,
    network_spynet,
    network_vrt,
    video_inference,
)
from models.net_io import net_io  # noqa: E402
from models.video_inference import infer_video  # noqa: E402

PRESETS = {'vrt': VRT_PRESETS, 'rvrt': RVRT_PRESETS, 'basicvsrpp': BVPP_PRESETS}
COPY_OPS = ('aten::copy_', 'aten::cat', 'aten::stack', 'aten::clone', 'aten::index_copy_')
LABEL = 'part::'

# (owner, attribute, part): forwards, methods and functions labelled for the profile (innermost wins)
LABELLED: list[tuple[Any, str, str]] = [
    (layers_attention.WindowAttention, 'forward', 'attention (qkv, kernel, projection)'),
    (layers_attention.TMSA, '_attn_part', 'window shift/partition/pad, norm'),
    (layers_attention.TMSA, '_ffn_part', 'MLP, norm'),
    (layers_attention, 'compute_shift_mask', 'window shift/partition/pad, norm'),
    (layers_attention, 'compute_mask', 'window shift/partition/pad, norm'),
    (network_spynet.SpyNet, 'forward', 'flow estimation (SpyNet)'),
    (layers_deform_conv.DCNv2PackFlowGuided, 'forward', 'deformable alignment'),
    (network_basicvsrpp.SecondOrderDeformableAlignment, 'forward', 'deformable alignment'),
    (layers_guided_deform_attn.GuidedDeformAttnPack, 'forward', 'deformable alignment'),
    (network_vrt.Stage, '_parallel_warp', 'flow warping, composition'),
    (network_vrt.VRT, 'get_flows', 'flow warping, composition'),
    (network_vrt.VRT, '_align_images', 'flow warping, composition'),
    (network_rvrt.RVRT, 'compute_flow', 'flow warping, composition'),
    (network_rvrt.RVRT, '_compose_flows', 'flow warping, composition'),
    (network_basicvsrpp.BasicVSRPlusPlus, 'compute_flow', 'flow warping, composition'),
    (network_vrt, 'flow_warp', 'flow warping, composition'),
    (network_rvrt, 'flow_warp', 'flow warping, composition'),
    (network_basicvsrpp, 'flow_warp', 'flow warping, composition'),
    (network_vrt.VRT, '_reconstruct', 'reconstruction head (convolutions)'),
    (network_rvrt.RVRT, '_head', 'reconstruction head (convolutions)'),
    (network_basicvsrpp.BasicVSRPlusPlus, '_head', 'reconstruction head (convolutions)'),
    (network_basicvsrpp.BasicVSRPlusPlus, 'propagate', 'propagation backbone (convolutions)'),
    (video_inference, '_infer_clip', 'tiling: pad, crop, blend'),
    # IART (benchmarks/profile_released.py profiles its released constructor)
    (network_iart.WindowAttention3D, 'forward', 'attention (qkv, kernel, projection)'),
    (network_iart.SwinBlock, '_attn_part', 'window shift/partition/pad, norm'),
    (network_iart.SwinBlock, 'forward', 'MLP, norm'),
    (network_iart, 'shifted_windows', 'window shift/partition/pad, norm'),
    (network_iart, 'window_partition', 'window shift/partition/pad, norm'),
    (network_iart, 'window_reverse', 'window shift/partition/pad, norm'),
    (network_iart.ImplicitWarp, 'forward', 'alignment (IART implicit warp)'),
    (network_iart.IART, 'compute_flow', 'flow warping, composition'),
    (network_iart, 'flow_warp', 'flow warping, composition'),
    (network_iart.PropagationTransformer, 'forward', 'propagation transformer (embed, residual convs, norms)'),
    (network_iart.IART, 'propagate', 'propagation: stacks, layout'),
    (network_iart.IART, '_head', 'reconstruction head (convolutions)'),
]


def _labelled(fn: Callable, part: str) -> Callable:
    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        with record_function(LABEL + part):
            return fn(*args, **kwargs)
    return run


@contextlib.contextmanager
def labels(net: nn.Module) -> Iterator[None]:
    """Wrap the :data:`LABELLED` forwards and functions (and the network's own forward) for the profile."""
    saved = []
    for owner, name, part in LABELLED:
        if name in vars(owner):
            original = vars(owner)[name]
            saved.append((owner, name, original))
            if isinstance(original, staticmethod):
                setattr(owner, name, staticmethod(_labelled(original.__func__, part)))
            else:
                setattr(owner, name, _labelled(original, part))
    # what the network's forward does outside every part (input concatenation, skip connections, ...)
    original_forward = type(net).forward
    saved.append((type(net), 'forward', original_forward))
    type(net).forward = _labelled(original_forward, 'other network ops (norms, linears, residuals)')
    try:
        yield
    finally:
        for owner, name, original in reversed(saved):
            setattr(owner, name, original)


def _part_of(event: Any, by_sequence: dict[int, str]) -> str:
    """The innermost labelled range or backward node around ``event``."""
    e = event
    while e is not None:
        if e.name.startswith(LABEL):
            return e.name[len(LABEL):]
        if e.name.startswith('autograd::engine::evaluate_function'):
            part = by_sequence.get(e.sequence_nr)
            if part is not None:
                return part
        e = e.cpu_parent
    return ''


def attribute(prof: profile, default: str, device: bool = False) -> dict[str, dict[str, float]]:
    """Per part: own time (ms; the GPU time of its kernels when ``device``) and the time of copy operators in it."""
    events = [e for e in prof.events() if e.device_type.name == 'CPU']
    by_sequence: dict[int, str] = {}
    for e in events:  # forward operators that created autograd nodes
        if e.sequence_nr >= 0 and not e.name.startswith('autograd::'):
            part = _part_of(e, {})
            if part and e.sequence_nr not in by_sequence:
                by_sequence[e.sequence_nr] = part
    table: dict[str, dict[str, float]] = defaultdict(lambda: {'ms': 0.0, 'copies_ms': 0.0})
    for e in events:
        if e.name.startswith(LABEL):
            continue
        part = _part_of(e, by_sequence) or default
        ms = (e.self_device_time_total if device else e.self_cpu_time_total) / 1e3
        table[part]['ms'] += ms
        if e.name in COPY_OPS:
            table[part]['copies_ms'] += ms
    return dict(table)


def _charbonnier(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return torch.sqrt((x - y) ** 2 + 1e-9).mean()


def build(net_type: str, preset: str) -> nn.Module:
    kwargs = {**PRESETS[net_type][preset]}
    if net_type != 'basicvsrpp':
        kwargs['spynet_path'] = None
    cls = {'vrt': network_vrt.VRT, 'rvrt': network_rvrt.RVRT, 'basicvsrpp': network_basicvsrpp.BasicVSRPlusPlus}
    torch.manual_seed(0)
    return cls[net_type](**kwargs)


def _sync(device: torch.device) -> None:
    if device.type == 'cuda':
        torch.cuda.synchronize(device)


def train_step(net: nn.Module, ema: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor,
               y: torch.Tensor, amp: torch.dtype | None = None) -> None:
    opt.zero_grad(set_to_none=True)
    with record_function(LABEL + 'loss'), torch.autocast(x.device.type, amp or torch.float32, enabled=amp is not None):
        out = net(x)
        loss = _charbonnier(out, y)
    loss.backward()
    with record_function(LABEL + 'optimizer (Adam)'):
        opt.step()
    with record_function(LABEL + 'EMA update'), torch.no_grad():
        torch._foreach_lerp_(list(ema.parameters()), list(net.parameters()), 1 - 0.999)


def data_loading_ms(io: Any, frames: int, size: tuple[int, int], batches: int = 3) -> float:
    """Main-process seconds per batch of the synthetic training set at this clip size (ms)."""
    from data.dataset_synthetic import SyntheticVideoTrainDataset

    task = 'sr' if io.scale > 1 else ('denoise' if io.noise_map else 'deblur')
    gt = size[0] * io.scale
    ds = SyntheticVideoTrainDataset({'task': task, 'scale': io.scale, 'num_frame': frames, 'gt_size': gt,
                                     'num_clips': batches + 1, 'seed': 0})
    loader = torch.utils.data.DataLoader(ds, batch_size=1, num_workers=0)
    it = iter(loader)
    next(it)
    start = time.perf_counter()
    for _ in range(batches):
        next(it)
    return (time.perf_counter() - start) / batches * 1e3


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--net', choices=sorted(PRESETS), default='vrt')
    parser.add_argument('--preset', default='tiny')
    parser.add_argument('--frames', type=int, help='training clip frames (default: the benchmark default)')
    parser.add_argument('--size', type=int, nargs=2, metavar=('H', 'W'), help='training clip LQ size')
    parser.add_argument('--eval-frames', type=int, default=12, help='frames of the evaluated clip')
    parser.add_argument('--eval-size', type=int, nargs=2, default=(96, 96), help='LQ size of the evaluated clip')
    parser.add_argument('--eval-tile', type=int, nargs=2, default=(6, 64), help='temporal tile, spatial tile (LQ)')
    parser.add_argument('--eval-overlap', type=int, nargs=2, default=(2, 16))
    parser.add_argument('--skip', choices=('train', 'eval'), help='profile only the other one')
    parser.add_argument('--threads', type=int, default=2)
    parser.add_argument('--trace', help='write the Chrome trace of the training step here')
    parser.add_argument('--device', default='cpu', help='cpu or cuda (GPU kernel time per part)')
    parser.add_argument('--amp', choices=('none', 'bf16'), default='none', help='autocast of the forward and loss')
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    amp = torch.bfloat16 if args.amp == 'bf16' else None
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == 'cuda' else [])
    on_device = device.type == 'cuda'

    net = build(args.net, args.preset).to(device)
    io = net_io(net)
    defaults = {'vrt': (6, 64, 64), 'rvrt': (4, 64, 64), 'basicvsrpp': (10, 64, 64)}[args.net]
    if args.net == 'basicvsrpp' and not io.scale > 1:
        defaults = (10, 256, 256)
    frames = io.clip_frames or args.frames or defaults[0]
    h, w = args.size or defaults[1:]
    gen = torch.Generator().manual_seed(0)
    results: dict[str, Any] = {'net': args.net, 'preset': args.preset, 'device': str(device), 'amp': args.amp,
                               'threads': torch.get_num_threads(),
                               'torch': torch.__version__, 'params': sum(p.numel() for p in net.parameters())}
    parts: dict[str, dict[str, dict[str, float]]] = {}
    if args.skip != 'train':
        x = torch.rand(1, frames, io.in_chans, h, w, generator=gen).to(device)
        out_frames = 1 if io.frame_interpolation else frames
        y = torch.rand(1, out_frames, io.out_chans, h * io.scale, w * io.scale, generator=gen).to(device)
        ema = build(args.net, args.preset).to(device)
        ema.load_state_dict(net.state_dict())
        opt = torch.optim.Adam(net.parameters(), lr=1e-4, betas=(0.9, 0.99))
        net.train()
        train_step(net, ema, opt, x, y, amp)  # warm-up (masks, optimizer state)
        _sync(device)
        with labels(net), profile(activities=activities) as prof:
            start = time.perf_counter()
            train_step(net, ema, opt, x, y, amp)
            _sync(device)
            results['train_step_s'] = round(time.perf_counter() - start, 3)
        if args.trace:
            prof.export_chrome_trace(args.trace)
        parts['train'] = attribute(prof, 'backward engine, other', on_device)
        results['train_clip'] = [frames, h, w]
        results['data_loading_ms'] = round(data_loading_ms(io, frames, (h, w)), 1)
    if args.skip != 'eval':
        net.eval()
        eval_frames = io.clip_frames or args.eval_frames
        lq = torch.rand(1, eval_frames, io.in_chans, *args.eval_size, generator=gen)  # stays on the host, as users'
        tile, overlap = args.eval_tile, args.eval_overlap
        kwargs = {'scale': io.scale, 'window_size': io.input_multiple, 'in_chans': io.in_chans,
                  'vfi': io.frame_interpolation, 'clip_frames': io.clip_frames, 'num_frame_testing': tile[0],
                  'num_frame_overlapping': overlap[0], 'size_patch_testing': tile[1], 'overlap_size': overlap[1],
                  'device': device, 'autocast_dtype': amp}
        infer_video(net, lq, **kwargs)  # warm-up
        _sync(device)
        with labels(net), profile(activities=activities) as prof:
            start = time.perf_counter()
            infer_video(net, lq, **kwargs)
            _sync(device)
            results['eval_s'] = round(time.perf_counter() - start, 3)
        parts['eval'] = attribute(prof, 'tiling: pad, crop, blend', on_device)
        results['eval_clip'] = [eval_frames, *args.eval_size]
        results['eval_tile'] = [*tile, *overlap]
    results['parts_ms'] = {k: {p: {m: round(v, 1) for m, v in d.items()} for p, d in t.items()}
                           for k, t in parts.items()}
    _print_table(results, parts)
    print(json.dumps(results), flush=True)
    return 0


def _print_table(results: dict[str, Any], parts: dict[str, dict[str, dict[str, float]]]) -> None:
    kinds = list(parts)
    names = sorted({p for t in parts.values() for p in t},
                   key=lambda p: -max(parts[k].get(p, {'ms': 0})['ms'] for k in kinds))
    totals = {k: sum(d['ms'] for d in parts[k].values()) for k in kinds}
    head = ' | '.join(f'{k} ms (%) | of which copies ms' for k in kinds)
    lines = [f'| part | {head} |', '|' + '---|' * (1 + 2 * len(kinds))]
    for name in names:
        cells = []
        for k in kinds:
            d = parts[k].get(name, {'ms': 0.0, 'copies_ms': 0.0})
            share = 100 * d['ms'] / totals[k] if totals[k] else 0
            cells += [f"{d['ms']:.0f} ({share:.0f}%)", f"{d['copies_ms']:.0f}"]
        lines.append(f"| {name} | {' | '.join(cells)} |")
    if 'data_loading_ms' in results:
        lines.append(f"| data loading (synthetic set, main process, per batch) | {results['data_loading_ms']:.0f} |"
                     + ' |' * (2 * len(kinds) - 1))
    cells = []
    for k in kinds:
        cells += [f'{totals[k]:.0f} (profiled)', '']
    lines.append(f"| **total** | {' | '.join(cells)} |")
    print('\n'.join(lines), flush=True)


if __name__ == '__main__':
    sys.exit(main())
