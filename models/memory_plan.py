"""Peak GPU memory of a training recipe per process, estimated without a GPU (a forward pass on the meta device).

The estimate is the sum of

* static memory: parameters and buffers, gradients, the optimizer state (Adam/AdamW: two moments), the EMA copy
  (``E_decay > 0``) and, under DDP (``world_size > 1``), the gradient buckets (one more copy of the gradients);
* activations kept for backward: the tensors autograd saves during the forward pass, counted once per storage
  (``torch.autograd.graph.saved_tensors_hooks``), parameters excluded; activation checkpointing keeps only the
  inputs of a checkpointed region;
* the largest transient: the activations a checkpointed region re-creates while backward runs through it,
  twice the largest tensor one call produces (the tensor and its gradient), or what the largest attention backward
  of the CPU's trainable-bias path allocates (its gradients and score chunks,
  :func:`models.layers_sdpa.backward_scratch_bytes`), whichever is largest.

The pass follows the CUDA code path: meta tensors take the non-CPU branches (head-dim padding, chunking,
``train.deterministic`` formulations), attention calls that the memory-efficient kernel accepts are run as that
kernel (so the saved set is its q, k, v, bias, output and log-sum-exp, not the math kernel's probabilities), and
``train.amp`` is emulated with CUDA autocast's rules (matmuls and convolutions in bf16/fp16, layer norm and softmax
in fp32, the regions the networks run in fp32 left alone). The CUDA context (about 0.5 GB, outside PyTorch's
allocator) and allocator fragmentation come on top: :data:`CUDA_CONTEXT_GB` and :data:`FRAGMENTATION` are what
:func:`fits` adds. With ``device='cpu'`` the pass runs for real on the CPU (its own code path and CPU autocast).

Known limits: the allocator's rounding and caching, cuDNN/cuBLAS workspaces and the NCCL buffers are not modelled;
the transient is a bound of the right order, not a simulation of backward.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import math
import sys
import warnings
import weakref
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode
from torch.utils import checkpoint as torch_checkpoint

from models import layers_sdpa, layers_warp, layers_window
from models.net_io import NetIO, net_io
from models.select_network import define_network, network_kwargs, network_specs

logger = logging.getLogger(__name__)

GB = 2**30
CUDA_CONTEXT_GB = 0.5
FRAGMENTATION = 0.10  # allocator rounding and fragmentation, as a fraction of the activations and transient
AMP_DTYPES = {"none": None, "bf16": torch.bfloat16, "fp16": torch.float16}

# CUDA autocast's lists, as far as these networks call them (at the torch-function level, above autograd, where
# autocast's casts sit too): what runs in the low-precision dtype, and what runs in fp32
_LOW_PRECISION = {
    F.linear, F.conv1d, F.conv2d, F.conv3d, F.conv_transpose1d, F.conv_transpose2d, F.conv_transpose3d,
    torch.matmul, torch.mm, torch.bmm, torch.baddbmm, torch.addmm, torch.einsum, Tensor.matmul, Tensor.__matmul__,
    Tensor.mm, Tensor.bmm, F.scaled_dot_product_attention,
}
_FP32 = {F.layer_norm, F.group_norm, F.softmax, F.log_softmax, torch.softmax, Tensor.softmax, Tensor.log_softmax}


@dataclass(frozen=True)
class MemoryEstimate:
    """Peak memory of one training process, in GiB (see the module docstring for what each part counts).

    Attributes:
        precision: ``'fp32'``, ``'bf16'`` or ``'fp16'``.
        micro_batch: clips per forward pass in this process.
        clip: LQ input shape of one clip ``(T, C, h, w)``.
        params, grads, optimizer, ema, ddp_buckets: static parts.
        activations: tensors saved for backward (``attention`` of them in attention calls).
        transient: the largest transient.
        total: the estimated peak of PyTorch's allocator (``torch.cuda.max_memory_allocated``).
    """

    precision: str
    micro_batch: int
    clip: tuple[int, ...]
    params: float
    grads: float
    optimizer: float
    ema: float
    ddp_buckets: float
    activations: float
    attention: float
    transient: float
    total: float

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def summary(self) -> str:
        """One line: ``bf16: 12.34 GB per process (params 0.11, grads 0.11, ...)``."""
        parts = ", ".join(f"{k} {getattr(self, k):.2f}" for k in ("params", "grads", "optimizer", "ema",
                                                                   "ddp_buckets", "activations", "transient"))
        return (f"{self.precision}: {self.total:.2f} GB per process at {self.micro_batch} clip(s) of "
                f"{'x'.join(map(str, self.clip))} ({parts}; attention {self.attention:.2f} of the activations)")


def train_clip(opt: dict[str, Any], io: NetIO | None = None) -> tuple[tuple[int, int, int, int],
                                                                      tuple[int, int, int, int]]:
    """LQ and GT shapes ``(T, C, h, w)`` of one training clip of a recipe, from its train dataset and what its
    network eats (``io``; default: the ``netG`` built on the meta device): the scale, the channels and frame
    interpolation are the network's.

    Frame interpolation reads ``io.clip_frames`` frames (else every ``temporal_scale``-th of the clip) and gives
    one. Vimeo sets: ``num_frame`` -1 means all 7 frames, ``mirror_sequence`` doubles the frames and
    ``pad_sequence`` adds one.
    """
    data = next(v for k, v in opt["datasets"].items() if k.startswith("train"))
    io = io or net_io(_recipe_network(opt, {}, torch.device("meta")))
    frames = int(data.get("num_frame", 1))
    if frames == -1 and "vimeo" in str(data.get("dataset_type", "")).lower():
        frames = 7  # a Vimeo-90K septuplet (the dataset's rule for -1)
    out_frames = frames
    if io.frame_interpolation:
        frames = io.clip_frames or math.ceil(frames / int(data.get("temporal_scale", 2)))
        out_frames = 1
    elif data.get("mirror_sequence"):
        frames = out_frames = frames * 2
    elif data.get("pad_sequence"):
        frames = out_frames = frames + 1
    gt = int(data.get("gt_size", 64))
    return (frames, io.in_chans, gt // io.scale, gt // io.scale), (out_frames, io.out_chans, gt, gt)


# -------------------------------------------------------------------------------------------- the pass
class _Tracker:
    """Saved-tensor and output accounting of one forward pass."""

    def __init__(self, excluded: set[int]) -> None:
        self.excluded = excluded  # parameter and buffer storages
        self.regions: list[dict[int, int]] = [{}]  # saved storages: the pass's, then open checkpoint regions'
        self.largest_region = 0
        self.largest_output = 0
        self.largest_backward = 0  # our attention backward's own allocations (the CPU's trainable-bias path)
        self.attention = 0
        self.kept = 0

    @staticmethod
    def key(t: Tensor) -> tuple[int, int]:
        storage = t.untyped_storage()
        return storage._cdata, storage.nbytes()

    def pack(self, t: Tensor) -> Tensor:
        storage = t.untyped_storage()
        cdata, region = storage._cdata, self.regions[-1]
        if cdata not in self.excluded and cdata not in region:
            region[cdata] = storage.nbytes()
            # a node freed during the pass (a detached branch) frees what it saved: drop it when its storage dies
            # (before the address can be reused)
            weakref.finalize(storage, region.pop, cdata, None)
        return t

    def output(self, value: Any) -> None:
        tensors = [value] if isinstance(value, Tensor) else [v for v in value if isinstance(v, Tensor)] \
            if isinstance(value, (tuple, list)) else []
        total = sum(dict(self.key(t) for t in tensors).values())
        self.largest_output = max(self.largest_output, total)

    @property
    def saved(self) -> int:
        return sum(self.regions[0].values())


class _Emulation(TorchFunctionMode):
    """CUDA autocast's casts at the torch-function level (on the meta device, which has no autocast), and the
    size of what each call returns."""

    def __init__(self, tracker: _Tracker, dtype: torch.dtype | None) -> None:
        super().__init__()
        self.tracker, self.dtype = tracker, dtype
        self.enabled = dtype is not None
        self._casts: dict[int, Tensor] = {}  # leaf parameters are cast once per pass (autocast's weight cache)

    def _cast(self, value: Any, to: torch.dtype, sources: tuple[torch.dtype, ...]) -> Any:
        if isinstance(value, Tensor) and value.is_floating_point() and value.dtype in sources:
            if value.is_leaf and value.requires_grad:
                key = id(value)
                if key not in self._casts:
                    self._casts[key] = value.to(to)
                return self._casts[key]
            return value.to(to)
        if isinstance(value, (list, tuple)):
            return type(value)(self._cast(v, to, sources) for v in value)
        return value

    def __torch_function__(self, func: Callable, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if self.enabled and func in _LOW_PRECISION:
            args, kwargs = self._cast(args, self.dtype, (torch.float32,)), {
                k: self._cast(v, self.dtype, (torch.float32,)) for k, v in kwargs.items()}
        elif self.enabled and func in _FP32:
            args = self._cast(args, torch.float32, (torch.bfloat16, torch.float16))
        out = func(*args, **kwargs)
        self.tracker.output(out)
        return out


@contextlib.contextmanager
def _patched(attribute: str, original: Any, replacement: Any) -> Iterator[None]:
    """Replace ``attribute`` in every loaded ``models.*`` module where it is ``original``."""
    modules = [m for name, m in list(sys.modules.items())
               if name.startswith("models.") and getattr(m, attribute, None) is original]
    for module in modules:
        setattr(module, attribute, replacement)
    try:
        yield
    finally:
        for module in modules:
            setattr(module, attribute, original)


def _pass_hooks(tracker: _Tracker, emulation: _Emulation | None) -> contextlib.ExitStack:
    """Checkpoint regions counted apart, autocast-free regions honoured, the efficient kernel's saved set."""

    def counting_checkpoint(fn: Callable, *args: Any, **kwargs: Any) -> Any:
        kwargs.pop("use_reentrant", None)
        tracker.regions.append({})
        try:
            out = fn(*args, **kwargs)
        finally:
            inner = tracker.regions.pop()
        tracker.largest_region = max(tracker.largest_region, sum(inner.values()))
        for a in args:  # what non-reentrant checkpointing keeps: the region's inputs
            if isinstance(a, Tensor):
                tracker.pack(a)
        return out

    original_off = layers_warp.autocast_off

    @contextlib.contextmanager
    def autocast_off(device: torch.device) -> Iterator[None]:
        if emulation is None:
            with original_off(device):
                yield
            return
        enabled, emulation.enabled = emulation.enabled, False
        try:
            yield
        finally:
            emulation.enabled = enabled

    sdpa = layers_sdpa._sdpa

    def efficient_sdpa(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, scale: float) -> Tensor:
        if q.device.type != "meta" or layers_sdpa.efficient_kernel_blockers(q, k, v, mask):
            tracker.largest_backward = max(tracker.largest_backward, layers_sdpa.backward_scratch_bytes(q, v, mask))
            return sdpa(q, k, v, mask, scale)
        region = tracker.regions[-1]
        before = dict(region)
        out = torch.ops.aten._scaled_dot_product_efficient_attention(
            q, k, v, mask, torch.is_grad_enabled(), 0.0, False, scale=scale)[0]
        if len(tracker.regions) == 1:  # inside a checkpointed region it is part of the transient, not kept
            tracker.attention += sum(n for c, n in region.items() if c not in before)
        return out

    stack = contextlib.ExitStack()
    stack.enter_context(_patched("checkpoint", torch_checkpoint.checkpoint, counting_checkpoint))
    stack.enter_context(_patched("autocast_off", original_off, autocast_off))
    stack.enter_context(_patched("_sdpa", sdpa, efficient_sdpa))
    return stack


def _forward_pass(net: nn.Module, lq: Tensor, gt: Tensor, amp: torch.dtype | None,
                  deterministic: bool) -> _Tracker:
    excluded = {_Tracker.key(t)[0] for t in [*net.parameters(), *net.buffers()]}
    tracker = _Tracker(excluded)
    meta = lq.device.type == "meta"
    emulation = _Emulation(tracker, amp if meta else None)
    autocast = (torch.autocast("cpu", dtype=amp) if amp is not None and not meta else contextlib.nullcontext())
    # shift masks built in the pass stay out of the process's cache (they are meta tensors)
    saved_cache, layers_window.MASK_CACHE = layers_window.MASK_CACHE, layers_window._MaskCache()
    if meta:  # torch.equal (RVRT's mirrored-input test) has no meta kernel: the unmirrored input costs more
        net.is_mirror_extended = lambda lqs: False
    try:
        with contextlib.ExitStack() as stack, warnings.catch_warnings():
            warnings.simplefilter("ignore")
            stack.enter_context(layers_warp.force_deterministic_kernels(deterministic and meta))
            stack.enter_context(_pass_hooks(tracker, emulation if meta else None))
            # every drop-path branch computed: the estimate is the step whose draws keep them all
            stack.enter_context(_patched("SKIP_DROPPED_BRANCHES", True, False))
            stack.enter_context(torch.autograd.graph.saved_tensors_hooks(tracker.pack, lambda t: t))
            stack.enter_context(emulation)
            stack.enter_context(autocast)
            out = net(lq)
            loss = torch.sqrt((out.float() - gt.float()) ** 2 + 1e-9).mean()
            tracker.output(loss)
            tracker.kept = tracker.saved  # while the graph is alive: what backward will start from
    finally:
        layers_window.MASK_CACHE = saved_cache
        if meta:
            del net.is_mirror_extended
    return tracker


def _recipe_network(opt: dict[str, Any], flags: dict[str, Any], device: torch.device) -> nn.Module:
    kwargs = {**network_kwargs(opt["netG"]), **flags}
    kwargs.pop("net_type", None)
    if "spynet_path" in kwargs:
        kwargs["spynet_path"] = None  # weights do not change the memory; the file may not be here
    with torch.device(device):
        net = define_network(opt["netG"]["net_type"], kwargs)
    return net.train()


def estimate_peak_memory(opt: dict[str, Any], device: torch.device | str = "cuda", amp: str | None = None,
                         micro_batch: int | None = None, world_size: int | None = None,
                         net_flags: dict[str, Any] | None = None,
                         clip: tuple[tuple[int, ...], tuple[int, ...]] | None = None) -> MemoryEstimate:
    """Estimate the peak memory of one training process of a recipe.

    Args:
        opt: parsed options (``datasets.train``, ``netG``, ``train``).
        device: the training device: ``'cuda'`` (the pass runs on the meta device along the CUDA code path) or
            ``'cpu'`` (the pass runs for real on the CPU: small recipes only).
        amp: ``'none'``, ``'bf16'`` or ``'fp16'`` (default: ``train.amp``).
        micro_batch: clips per forward pass (default: ``dataloader_batch_size / (world_size * grad_accum_steps)``).
        world_size: processes (default 1); DDP adds its gradient buckets when above 1.
        net_flags: netG overrides, e.g. ``{'use_checkpoint_attn': True}``.
        clip: ``(lq_shape, gt_shape)`` of one clip (default: :func:`train_clip`).

    Returns:
        The :class:`MemoryEstimate`.
    """
    device = torch.device(device)
    t_opt = opt.get("train", {})
    amp = amp or t_opt.get("amp", "none")
    world = int(world_size or 1)
    if micro_batch is None:
        data = next(v for k, v in opt["datasets"].items() if k.startswith("train"))
        total = int(data.get("dataloader_batch_size", 1))
        micro_batch = max(1, total // (world * int(t_opt.get("grad_accum_steps", 1))))
    run_on = torch.device("meta") if device.type != "cpu" else device
    net = _recipe_network(opt, dict(net_flags or {}), run_on)
    lq_shape, gt_shape = clip or train_clip(opt, net_io(net))
    gen = None if run_on.type == "meta" else torch.Generator().manual_seed(0)
    lq = torch.rand(micro_batch, *lq_shape, device=run_on, generator=gen)
    gt = torch.rand(micro_batch, *gt_shape, device=run_on, generator=gen)
    tracker = _forward_pass(net, lq, gt, AMP_DTYPES[amp], bool(t_opt.get("deterministic", True)))

    params = sum(p.numel() * p.element_size() for p in net.parameters())
    buffers = sum(b.numel() * b.element_size() for b in net.buffers())
    adam_states = 2 if str(t_opt.get("G_optimizer_type", "adam")).lower() in ("adam", "adamw") else 1
    ema = params + buffers if float(t_opt.get("E_decay", 0) or 0) > 0 else 0
    ddp = params if world > 1 else 0
    transient = max(tracker.largest_region, 2 * tracker.largest_output, tracker.largest_backward)
    parts = {"params": params + buffers, "grads": params, "optimizer": adam_states * params, "ema": ema,
             "ddp_buckets": ddp, "activations": tracker.kept, "attention": tracker.attention,
             "transient": transient}
    total = sum(v for k, v in parts.items() if k != "attention")
    return MemoryEstimate(precision="fp32" if amp == "none" else amp, micro_batch=micro_batch,
                          clip=tuple(lq_shape), total=total / GB, **{k: v / GB for k, v in parts.items()})


# ------------------------------------------------------------------------------------------ what fits
CHECKPOINT_SETTINGS: dict[str, dict[str, Any]] = {
    "as in the recipe": {},
    "attention checkpointed": {"use_checkpoint_attn": True, "no_checkpoint_attn_blocks": []},
    "attention + FFN checkpointed": {"use_checkpoint_attn": True, "use_checkpoint_ffn": True,
                                     "no_checkpoint_attn_blocks": [], "no_checkpoint_ffn_blocks": []},
}


def needed_gb(estimate: MemoryEstimate) -> float:
    """Device memory a run needs: the estimate plus fragmentation and the CUDA context."""
    return estimate.total + FRAGMENTATION * (estimate.activations + estimate.transient) + CUDA_CONTEXT_GB


def fits(opt: dict[str, Any], gpu_mem_gb: float, world_size: int = 1, precisions: tuple[str, ...] = ("none", "bf16"),
         checkpointing: tuple[str, ...] = tuple(CHECKPOINT_SETTINGS)) -> list[dict[str, Any]]:
    """Settings that keep the recipe's global batch and fit in ``gpu_mem_gb`` per process.

    Tries each precision, each checkpoint setting (keys of :data:`CHECKPOINT_SETTINGS`) and each ``grad_accum_steps``
    that divides the per-process batch; activations scale with the micro-batch (estimated once per precision and
    checkpoint setting at the largest micro-batch and scaled, which slightly overestimates smaller ones).

    Returns:
        One dict per fitting setting, cheapest first (fewest accumulation steps, least checkpointing, then bf16
        before fp32): ``{'amp', 'checkpointing', 'net_flags', 'grad_accum_steps', 'micro_batch', 'needed_gb'}``.
    """
    data = next(v for k, v in opt["datasets"].items() if k.startswith("train"))
    per_process = max(1, int(data.get("dataloader_batch_size", 1)) // world_size)
    takes = set(network_specs()[str(opt["netG"]["net_type"]).lower()])
    found = []
    for amp in precisions:
        for label in checkpointing:
            flags = CHECKPOINT_SETTINGS[label]
            if not set(flags) <= takes:  # a network without these checkpointing switches (BasicVSR++)
                continue
            full = estimate_peak_memory(opt, "cuda", amp, per_process, world_size, flags)
            per_clip = (full.activations + full.transient) / per_process
            static = full.total - full.activations - full.transient
            for accum in (a for a in range(1, per_process + 1) if per_process % a == 0):
                micro = per_process // accum
                dynamic = per_clip * micro
                need = static + dynamic * (1 + FRAGMENTATION) + CUDA_CONTEXT_GB
                if need <= gpu_mem_gb:
                    found.append({"amp": amp, "checkpointing": label, "net_flags": copy.deepcopy(flags),
                                  "grad_accum_steps": accum * int(opt["train"].get("grad_accum_steps", 1)),
                                  "micro_batch": micro, "needed_gb": round(need, 2)})
                    break
    order = {label: i for i, label in enumerate(CHECKPOINT_SETTINGS)}
    return sorted(found, key=lambda f: (f["grad_accum_steps"], order[f["checkpointing"]], f["amp"] == "none"))


def startup_line(opt: dict[str, Any], device: torch.device, world_size: int, micro_batch: int) -> str:
    """The training-start log line: ``peak memory estimate 10.8 GB of 79.1 GB per process (bf16, 1 clip(s) per
    forward)``; never raises (an estimate that fails says why instead)."""
    amp = opt["train"].get("amp", "none")
    try:
        with torch.random.fork_rng(devices=[]):  # the run's random streams stay untouched
            estimate = estimate_peak_memory(opt, device, amp, micro_batch, world_size)
    except Exception as exc:  # an estimate must never stop a run
        return f"peak memory estimate unavailable ({type(exc).__name__}: {exc})"
    have = ""
    if device.type == "cuda" and torch.cuda.is_available():
        have = f" of {torch.cuda.get_device_properties(device).total_memory / GB:.1f} GB"
    return (f"peak memory estimate {needed_gb(estimate):.1f} GB{have} per process ({estimate.precision}, "
            f"{micro_batch} clip(s) of {'x'.join(map(str, estimate.clip))} per forward; "
            f"python scripts/plan_memory.py --opt ... --gpu-mem GB lists settings that fit)")


# ------------------------------------------------------------------------------------- CPU inference tile
# The tile a CPU run of main_test_vrt.py takes when none is given (no --tile, and an option file whose
# val.num_frame_testing / size_patch_testing say "whole clip" / "whole frame", or a released task that restores
# whole clips and frames): the network's own temporal tile or CPU_TILE[0] frames, by CPU_TILE[1] LQ pixels. Host
# memory grows with the tile, not with the video (frames stream in and out), where the whole frames of a 1080p video
# would need tens of GB (benchmarks/RESULTS.md, "Host memory of CPU inference").
CPU_TILE = (16, 256)


def cpu_tile(tile: tuple[int, int], io: NetIO) -> tuple[int, int]:
    """``(frames, LQ pixels)`` of a CPU test tile: "the whole clip" (0 frames) becomes the network's own temporal tile
    (``NetIO.temporal_tile``: VRT's 40, BasicVSR++'s 100 frames), else :data:`CPU_TILE` frames, and "the whole frame"
    (0 pixels) becomes :data:`CPU_TILE` pixels, rounded down to the network's padding multiple. A tile given in
    numbers (a released task's, the option file's) is kept: a recurrent network's tile carries information along it,
    and shorter tiles overlapping by its recommended overlap would restore every frame several times. Frame
    interpolation keeps its whole clip (the network reads exactly its frames)."""
    frames, size = tile
    if not frames and not io.frame_interpolation:
        frames = io.temporal_tile or CPU_TILE[0]
    multiple = io.input_multiple[-1]
    return frames, size or max(multiple, CPU_TILE[1] // multiple * multiple)
