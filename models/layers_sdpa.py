"""The attention kernel call of the window attention: ``F.scaled_dot_product_attention`` made eligible for the fused
kernels on every device VRT and RVRT run on.

* off the CPU, q, k and v are zero-padded along the head dim to a multiple of :data:`HEAD_DIM_MULTIPLE` (exact),
  so that the fused CUDA kernels take VRT's head dims 20 and 30, bias gradient included;
* the folded (window x head) axis is cut into chunks of at most :data:`MAX_FOLDED` (the CUDA grid limit);
* on the CPU, a trainable bias goes through :class:`_BiasedAttention` (fused forward, recomputing backward);
* :func:`record_attention_calls` and :func:`efficient_kernel_blockers` tell which kernel a call gets.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils._python_dispatch import TorchDispatchMode


def _single_threaded() -> None:
    torch.get_num_threads()  # this thread's OpenMP/MKL settings first: its first parallel op would reset them
    torch.set_num_threads(1)
    # Denormals flushed to zero on this thread (the x86 MXCSR is per thread; other threads keep IEEE denormals). A
    # shift-masked window's probabilities are exp(-100 + ...) ~ 1e-44, denormal in fp32, and every pass over them
    # (the softmax, the products, mul_) took microcode assists: those calls' backward ran 1.6-2.1x slower than
    # unmasked ones. Flushed, their gradient terms are 0 instead of ~1e-44 below every sum they enter
    # (benchmarks/RESULTS.md, "VRT speed by profiling, session 8").
    torch.set_flush_denormal(True)


_POOLS: dict[tuple[int, int], ThreadPoolExecutor] = {}
_POOLS_LOCK = threading.Lock()


def _workers(count: int) -> ThreadPoolExecutor:
    """``count`` Python threads running torch ops on one OpenMP thread each, started once per process (a forked
    child gets its own: the parent's threads do not exist there)."""
    key = (os.getpid(), count)
    with _POOLS_LOCK:
        if key in _POOLS:
            return _POOLS[key]
        threads = torch.get_num_threads()
        pool = ThreadPoolExecutor(count, thread_name_prefix='attention-backward', initializer=_single_threaded)
        started = threading.Barrier(count)  # every worker set up before the default is given back below
        list(pool.map(lambda _: started.wait(), range(count)))
        torch.set_num_threads(threads)  # set_num_threads(1) in a worker also set the default of threads to come
        _POOLS[key] = pool
        return pool


def _in_parallel() -> bool:
    """Whether backward's parts may run on worker threads: several OpenMP threads here, and no dispatch or function
    mode (a mode is thread-local: the parts then run one after another here, with the same bits but for denormal
    terms, which the workers flush to zero)."""
    return (torch.get_num_threads() > 1 and not torch._C._is_torch_function_mode_enabled()
            and torch._C._len_torch_dispatch_stack() == 0)


class _BiasedAttention(torch.autograd.Function):
    """Attention with a trainable additive bias that stores no (N x N) matrix for backward.

    Forward is ``F.scaled_dot_product_attention`` (the fused kernel); backward recomputes the probabilities chunk by
    chunk (FlashAttention's recipe, with the row term ``rowsum(dO * O)``) and returns the gradients of q, k, v and
    the bias. Shapes: q, k, v (B, H, N, d); bias (1, H, N, N), broadcast over B.

    With several OpenMP threads, backward cuts the samples into one part per thread and runs each part on a worker
    thread of one OpenMP thread, in chunks that fit a core's L2 cache; each part sums its own bias gradient and the
    parts' sums are added in order, so the bits depend on the thread count only (deterministic mode stays
    bit-exact); the workers flush denormals to zero (see ``_single_threaded``). At VRT's head dims 8-12 every
    per-chunk pass is memory-bound: 8 MB chunks on two OpenMP threads streamed from the L3 cache, 2 MB chunks a core
    do not (five tiny-preset backward shapes 345 -> 232 ms, a VRT 001 one 220 -> 180 ms; benchmarks/RESULTS.md,
    "VRT speed by profiling, session 7"). Memory: at two threads the
    parts' chunks and second bias-gradient sum take less than one part's 8 MB chunks; :meth:`backward_bytes`
    counts them for every part at once (it grows with the thread count).
    """

    # Scores per backward chunk with one part: as many whole samples as fit in _CHUNK_ELEMENTS (8 MB of fp32), else
    # spans of one sample's heads up to that size. VRT's windows are the batch axis (B = windows x clips, 3-6
    # heads), and one sample per chunk made hundreds of tiny matrix products per call at its 64- and 128-token
    # windows, each a parallel region (with OMP_WAIT_POLICY=PASSIVE, a wake-up). Two chunks are alive at once.
    _CHUNK_ELEMENTS = 1 << 21
    # Scores per chunk of a part on one OpenMP thread: 2 MB of fp32, a Sapphire Rapids core's L2 (1 << 18 and
    # 1 << 20 were slower; benchmarks/RESULTS.md, "VRT speed by profiling, session 7").
    _PART_CHUNK_ELEMENTS = 1 << 19
    # Scores of a call below which one part runs: handing parts to the workers costs ~0.3 ms a call, more than
    # it gains on small calls (a (12, 3, 128, 8) backward 3.8 ms in parts vs 3.4 ms; (4, 3, 384, 8) 6.7 vs 7.2 ms).
    _PARTS_ABOVE = 1 << 20

    @staticmethod
    def chunking(b: int, heads: int, n: int, elements: int | None = None) -> tuple[int, int]:
        """(samples, heads) per backward chunk of a (b, heads, n, d) call, with at most ``elements`` scores
        (default ``_CHUNK_ELEMENTS``)."""
        step = max(1, (elements or _BiasedAttention._CHUNK_ELEMENTS) // (n * n))  # heads per chunk
        samples = max(1, step // heads) if step >= heads else 1
        return min(samples, b), min(step, heads)

    @staticmethod
    def parts(b: int, heads: int, n: int, threads: int | None = None) -> tuple[list[slice], int, int]:
        """How backward cuts a (b, heads, n, d) call at ``threads`` OpenMP threads (default: this thread's): the
        sample range of each part, and (samples, heads) per chunk. One part (in ``_CHUNK_ELEMENTS`` chunks) at one
        thread, below ``_PARTS_ABOVE`` scores, or where the samples make fewer than two chunks."""
        threads = torch.get_num_threads() if threads is None else threads
        samples, step = _BiasedAttention.chunking(b, heads, n, _BiasedAttention._PART_CHUNK_ELEMENTS)
        chunks = -(-b // samples)
        if threads < 2 or chunks < 2 or b * heads * n * n < _BiasedAttention._PARTS_ABOVE:
            return [slice(0, b)], *_BiasedAttention.chunking(b, heads, n)
        size = -(-chunks // min(threads, chunks)) * samples  # whole chunks per part
        return [slice(i, min(i + size, b)) for i in range(0, b, size)], samples, step

    @staticmethod
    def backward_bytes(q_shape: tuple[int, ...], v_shape: tuple[int, ...], element_size: int = 4,
                       strided: bool = False, threads: int | None = None, at_once: int | None = None) -> int:
        """Bytes that :meth:`backward` allocates at its peak for a (B, H, N, d) call at ``threads`` OpenMP threads
        (default: this thread's): the gradients of q, k, v and the bias, the contiguous incoming gradient, the row
        term, every part's bias-gradient sum but the first's, and for each part running at once (``at_once``,
        default all of them) two chunks of (N x N) scores plus a chunk's bias-gradient sum; with ``strided`` (q, k,
        v not contiguous, e.g. views of one qkv projection), their contiguous copies too."""
        b, heads, n, d = q_shape
        ranges, samples, hs = _BiasedAttention.parts(b, heads, n, threads)
        running = len(ranges) if at_once is None else min(at_once, len(ranges))
        values = b * heads * n * v_shape[-1]
        grads = 2 * b * heads * n * d + values + heads * n * n
        copies = 2 * b * heads * n * d + values if strided else 0
        partials = (len(ranges) - 1) * heads * n * n
        scratch = running * (2 * samples * hs * n * n + hs * n * n)
        return element_size * (grads + copies + values + b * heads * n + partials + scratch)

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, bias: Tensor, scale: float) -> Tensor:
        # detached, so the kernel choice does not see requires_grad (which would force the math fallback)
        out = F.scaled_dot_product_attention(q.detach(), k.detach(), v.detach(), attn_mask=bias.detach(), scale=scale)
        ctx.save_for_backward(q, k, v, bias, out)
        ctx.scale = scale
        return out

    @staticmethod
    def _part(tensors: tuple[Tensor, ...], grads: tuple[Tensor, ...], grad_bias: Tensor, rows: slice,
              samples: int, step: int, scale: float) -> None:
        """The gradients of samples ``rows``: q, k, v's into ``grads``, the bias's summed over them into
        ``grad_bias``."""
        q, k, v, bias, grad_out, row = tensors
        heads, n = q.shape[1], q.shape[2]
        # (B * H, ...) views: a chunk of whole samples is one slice of each (fewer ops a chunk to dispatch)
        flat = [t.flatten(0, 1) for t in (q, k, v, grad_out, row, *grads)]
        with torch.no_grad():  # grad mode is thread-local: on a worker thread it is on
            for i0 in range(rows.start, rows.stop, samples):
                count = min(samples, rows.stop - i0)
                for h0 in range(0, heads, step):
                    hs = slice(h0, min(h0 + step, heads))
                    # several samples come with all heads, so the chunk is one run of (sample, head) rows
                    rs = slice(i0 * heads + h0, (i0 + count - 1) * heads + hs.stop)
                    qh, kh, vh, go, r, gq, gk, gv = (t[rs] for t in flat)  # (S * h, N, d)
                    scores = q.new_empty(qh.shape[0], n, n)  # (S * h, N, N): the bias over S samples (one copy
                    scores.view(count, -1, n, n).copy_(bias[:, hs].expand(count, -1, n, n))  # pass, not repeat)
                    probs = scores.baddbmm_(qh, kh.transpose(-2, -1), alpha=scale).softmax(dim=-1)
                    del scores  # two chunks alive at most
                    torch.bmm(probs.transpose(-2, -1), go, out=gv)
                    grad_s = torch.bmm(go, vh.transpose(-2, -1)).sub_(r).mul_(probs)
                    per_sample, target = grad_s.view(count, -1, n, n), grad_bias[0, hs]
                    if i0 == rows.start:  # what 0 + this chunk's sum gives, without zero-filling the sum first
                        torch.sum(per_sample, 0, out=target) if count > 1 else target.copy_(grad_s)
                    else:
                        target += per_sample.sum(0) if count > 1 else grad_s
                    torch.baddbmm(gq, grad_s, kh, beta=0, alpha=scale, out=gq)
                    torch.baddbmm(gk, grad_s.transpose(-2, -1), qh, beta=0, alpha=scale, out=gk)
                    del probs, grad_s, per_sample  # the next chunk's scores come next: two chunks alive, not three

    @staticmethod
    def backward(ctx, grad_out: Tensor):
        q, k, v, bias, out = ctx.saved_tensors
        # contiguous once: views of one qkv projection made every chunk of several samples copy its q, k and v
        # (hundreds of small strided copies a step; benchmarks/RESULTS.md, "VRT speed by profiling, session 6")
        q, k, v = (t.contiguous() for t in (q, k, v))
        b, heads, n, _ = q.shape
        grad_out = grad_out.contiguous()
        row = (grad_out * out).sum(dim=-1, keepdim=True)  # (B, H, N, 1) = rowsum(dP * P)
        grads = tuple(t.new_empty(t.shape) for t in (q, k, v))  # contiguous
        ranges, samples, step = _BiasedAttention.parts(b, heads, n)
        sums = [torch.empty_like(bias) for _ in ranges]  # each part writes its own, the first is the result
        work = [((q, k, v, bias, grad_out, row), grads, total, rows, samples, step, ctx.scale)
                for total, rows in zip(sums, ranges)]
        if len(work) > 1 and _in_parallel():
            for done in [_workers(len(work)).submit(_BiasedAttention._part, *w) for w in work]:
                done.result()
        else:
            for w in work:
                _BiasedAttention._part(*w)
        for part in sums[1:]:  # in order: the same bits at every run
            sums[0] += part
        return *grads, sums[0], None


# The memory-efficient CUDA kernel (the one that takes a trainable additive mask) needs the head dim to be a multiple
# of 8 in fp16/bf16 and of 4 in fp32; VRT's head dims are 20 (120 / 6) and 30 (180 / 6), so without padding every
# attention call falls back to the math kernel, which stores the (N x N) probabilities. Zero columns in q and k add
# nothing to q . k, and zero columns in v give zero output columns that are cut off: exact.
HEAD_DIM_MULTIPLE = 8
# The CPU kernels take any head dim. Measured there (Xeon, 1 thread, 384 folded heads x 384 tokens, forward +
# backward): padding 20 -> 24 takes 1.02-1.18x the time, 30 -> 32 0.82-0.88x in fp32 (1.03-1.09x in bf16),
# i.e. noise-level either way; the CPU keeps the true head dim (and its bits). Tests set this to run the padded
# path on the CPU.
PAD_HEAD_DIM_ON_CPU = False
# The fused CUDA kernels put the batch and the head axis in grid.y/grid.z, limited to 65,535 (pytorch#142228:
# "invalid configuration argument" or a wrong result beyond it). Windows go along the batch axis (stage 8's
# per-frame windows of a 12 x 1024 x 1024 tile: 193,548), or, with a dense shift mask, are folded into the head axis
# (a 12 x 256 x 256 tile: 6,144 windows x 2 frames x 6 heads = 73,728 in the shifted mutual attention); the calls
# are cut into chunks of at most this many along both axes (exact: rows are independent).
MAX_FOLDED = 65535


def _pads_head_dim(t: Tensor) -> bool:
    return t.device.type != 'cpu' or PAD_HEAD_DIM_ON_CPU


def efficient_kernel_blockers(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None) -> list[str]:
    """Why CUDA's memory-efficient SDPA kernel (sm80+) would refuse these inputs, as far as our calls can differ:
    dtype, head-dim alignment, the grid limit, the last-dim stride and the mask dtype. Empty when eligible.

    A device-independent stand-in for ``torch.backends.cuda.can_use_efficient_attention`` (which needs CUDA
    tensors), so that CPU and meta-device runs can check the shapes the CUDA path produces.
    """
    reasons = []
    if q.dim() != 4 or {t.dim() for t in (k, v)} != {4}:
        reasons.append('inputs are not 4-D')
    if q.dtype not in (torch.float16, torch.bfloat16, torch.float32) or not q.dtype == k.dtype == v.dtype:
        reasons.append(f'dtypes {q.dtype}/{k.dtype}/{v.dtype}')
    align = 4 if q.dtype == torch.float32 else 8
    if q.shape[-1] != k.shape[-1] or q.shape[-1] % align or v.shape[-1] % align:
        reasons.append(f'head dims {q.shape[-1]}/{v.shape[-1]} not multiples of {align}')
    if q.dim() == 4 and max(q.shape[0], q.shape[1]) > 65535:
        reasons.append(f'batch x heads {q.shape[0]} x {q.shape[1]} above the grid limit 65,535')
    if any(t.stride(-1) != 1 for t in (q, k, v)):
        reasons.append('last dim not contiguous')
    if mask is not None and mask.dtype not in (torch.bool, q.dtype):
        reasons.append(f'mask dtype {mask.dtype}')
    return reasons


_OBSERVERS: list[list[dict[str, Any]]] = []
_SDPA_KERNELS = {
    'aten._scaled_dot_product_efficient_attention': 'efficient',
    'aten._scaled_dot_product_flash_attention': 'flash',
    'aten._scaled_dot_product_flash_attention_for_cpu': 'flash_cpu',
    'aten._scaled_dot_product_cudnn_attention': 'cudnn',
    'aten._scaled_dot_product_fused_attention_overrideable': 'overrideable',
}


class _KernelProbe(TorchDispatchMode):
    """Names the fused SDPA kernel dispatched inside it ('math' when only the decomposed ops ran)."""

    def __init__(self) -> None:
        super().__init__()
        self.kernel = 'math'

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = _SDPA_KERNELS.get(str(func.overloadpacket))
        if name is not None:
            self.kernel = name
        return func(*args, **(kwargs or {}))


@contextlib.contextmanager
def record_attention_calls() -> Iterator[list[dict[str, Any]]]:
    """Record every attention call made inside the block (a diagnostic for tests and benchmarks).

    Yields:
        A list that receives one dict per call: ``q``/``v``/``mask`` shapes, ``dtype``, ``device``,
        ``mask_grad`` (a trainable mask), ``path`` ('sdpa', or 'biased' for :class:`_BiasedAttention`),
        ``kernel`` (the forward kernel SDPA dispatched: 'efficient', 'flash', 'cudnn', 'flash_cpu' or 'math'),
        and ``blockers`` (:func:`efficient_kernel_blockers`).
    """
    calls: list[dict[str, Any]] = []
    _OBSERVERS.append(calls)
    try:
        yield calls
    finally:
        _OBSERVERS.remove(calls)


def _takes_biased_path(q: Tensor, mask: Tensor | None) -> bool:
    return mask is not None and mask.requires_grad and q.device.type == 'cpu' and torch.is_grad_enabled()


def backward_scratch_bytes(q: Tensor, v: Tensor, mask: Tensor | None) -> int:
    """Bytes the backward of one :func:`_sdpa` call allocates at its peak where that backward is ours
    (:class:`_BiasedAttention`: the CPU with a trainable mask), else 0 (SDPA's own kernels are not modelled)."""
    if not _takes_biased_path(q, mask):
        return 0
    strided = not all(t.is_contiguous() for t in (q, v))
    return _BiasedAttention.backward_bytes(tuple(q.shape), tuple(v.shape), q.element_size(), strided)


def _sdpa(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, scale: float) -> Tensor:
    """One attention call: (B, H, N, d) each, mask (1, H, N, N) or None -> (B, H, N, d).

    On the CPU a trainable mask goes through :class:`_BiasedAttention` (the CPU flash kernel cannot give the mask
    gradient, and its math fallback stores the (B, H, N, N) probabilities); elsewhere SDPA picks its kernel.
    """
    biased = _takes_biased_path(q, mask)
    probe = _KernelProbe() if _OBSERVERS else contextlib.nullcontext()
    with probe:
        if biased:
            out = _BiasedAttention.apply(q, k, v, mask, scale)
        else:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
    if _OBSERVERS:
        info = {'q': tuple(q.shape), 'v': tuple(v.shape), 'mask': None if mask is None else tuple(mask.shape),
                'dtype': str(q.dtype).replace('torch.', ''), 'device': q.device.type,
                'mask_grad': bool(mask is not None and mask.requires_grad), 'scale': scale,
                'path': 'biased' if biased else 'sdpa', 'kernel': probe.kernel,
                'blockers': efficient_kernel_blockers(q, k, v, mask)}
        for calls in _OBSERVERS:
            calls.append(info)
    return out


def _spans(n: int, limit: int) -> list[slice]:
    """``n`` split into the fewest near-equal spans of at most ``limit``."""
    parts = -(-n // limit)
    size = -(-n // parts)
    return [slice(i, min(i + size, n)) for i in range(0, n, size)]


def attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, scale: float) -> Tensor:
    """Scaled dot-product attention with the CUDA kernels' constraints taken care of.

    * off the CPU (or with :data:`PAD_HEAD_DIM_ON_CPU`), q, k, v are zero-padded along the head dim to a multiple
      of :data:`HEAD_DIM_MULTIPLE` and the output is cut back; ``scale`` stays the caller's (true head dim's);
    * batch and head axes above :data:`MAX_FOLDED` are cut into chunks (the mask sliced along with the heads).

    Args:
        q, k, v: (B, H, N, d).
        mask: (1, H, N, N) additive (trainable or not), or None.
        scale: the softmax scale, e.g. ``d ** -0.5`` of the unpadded d.

    Returns:
        (B, H, N, d).
    """
    hd = q.shape[-1]
    pad = (-hd) % HEAD_DIM_MULTIPLE if _pads_head_dim(q) else 0
    if pad:
        q, k, v = (F.pad(t, (0, pad)) for t in (q, k, v))
    b, heads = q.shape[:2]
    if b <= MAX_FOLDED and heads <= MAX_FOLDED:
        out = _sdpa(q, k, v, mask, scale)
    else:
        rows = []
        for bs in _spans(b, MAX_FOLDED):
            cols = [_sdpa(q[bs, hs], k[bs, hs], v[bs, hs], None if mask is None else mask[:, hs], scale)
                    for hs in _spans(heads, MAX_FOLDED)]
            rows.append(torch.cat(cols, 1) if len(cols) > 1 else cols[0])
        out = torch.cat(rows, 0) if len(rows) > 1 else rows[0]
    return out[..., :hd] if pad else out
