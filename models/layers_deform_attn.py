"""Guided deformable attention (RVRT) in pure PyTorch: no CUDA build, runs on CPU and GPU.

:func:`deform_attn` reproduces the reference CUDA operator (``models/op/deform_attn.py`` of RVRT), with the
same arguments and tensor layouts:

* ``q``: (B, ..., C, H, W) with ``B = N * clip_size`` query frames (the reference passes (B, 1, C, H, W));
* ``kv``: (N, clip_size, 2C, H, W), keys then values along channels;
* ``offset``: (B, clip_size * G * kh * kw * 2, H, W). Block ``n`` of query frame ``j`` (``b = N_i * clip + j``)
  samples kv frame ``(j + n) % clip_size`` of clip ``N_i``. Inside a block, group ``g`` and kernel point ``k``
  (row-major over the kh x kw window) hold ``(dy, dx)`` at channels ``(g * kh * kw + k) * 2 + {0, 1}``;
* the 2C kv channels are split into G contiguous deformable groups (so with G = 12 the first six groups move
  the keys and the last six the values), each group sampled at its own positions;
* sampling position of point (i, j) for output pixel (y, x): ``(y * stride - padding + i * dilation + dy,
  x * stride - padding + j * dilation + dx)`` in pixel indices, bilinear, each of the four neighbours outside
  the image contributing zero (the DCN im2col convention);
* per head (``head_dim = C / attention_heads``): ``softmax(q * head_dim**-0.5 . K)`` over the
  ``clip_size * kh * kw`` samples, then the weighted sum of the sampled values. Output has ``q``'s shape.

Numerics: the sampling and the attention run in float32 with autocast disabled (float64 inputs stay float64),
and the result is cast back to ``q.dtype``: sub-pixel positions do not survive bf16/fp16, and the softmax over
18 samples is cheap. The bilinear sampling is ``F.grid_sample(padding_mode='zeros', align_corners=False)``
with positions normalised as ``(2 * p + 1) / size - 1``, which is exactly the pixel-index convention of the
CUDA kernel (also for a size of 1); it runs through :func:`models.layers_warp.grid_sample`, whose backward is
deterministic under :func:`models.layers_warp.deterministic_kernels`.

Memory: the sampled keys/values are ``clip_size * kh * kw`` times the size of ``kv``. When autograd needs them and
they exceed :data:`RECOMPUTE_ABOVE_BYTES`, the operator is recomputed in backward (non-reentrant activation
checkpointing, the CUDA op's strategy too), so only ``q``, ``kv`` and ``offset`` are stored; smaller ones (small
networks and crops: the demo, the tests) are kept, which saves the second sampling (the same gradients). On the CPU,
without autograd, the keys and values are sampled in pieces of whole heads (and runs of pixels) of at most
:data:`CPU_SAMPLES_PIECE_BYTES` (the same bits): larger blocks are mapped afresh by glibc and faulted in page by page on
every call.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from models.layers_conv import CPU_HEAP_PIECE_BYTES, in_graph
from models.layers_warp import autocast_off, grid_sample

_COMPILED: dict[str, object] = {}

# Sampled keys/values of one call above which the default (``recompute=None``) recomputes them in backward rather
# than keeping them: RVRT tiny at 64 x 64 samples 54 MiB a call, and keeping them made its CPU train step 1.07x
# faster (benchmarks/RESULTS.md, "RVRT's guided deformable attention"); the released sizes (576 kv channels) sample
# 324 MiB a call at 64 x 64, and recompute.
RECOMPUTE_ABOVE_BYTES = 64 * 2**20
# Samples of one piece of the attention without autograd on the CPU (:func:`_attend_in_pieces`), a heap-sized piece
# (:data:`~models.layers_conv.CPU_HEAP_PIECE_BYTES`): the 96 MiB samples of a released RVRT's call at 48 x 48 were
# mapped afresh and faulted in, page by page, on every call (benchmarks/RESULTS.md, "Issue 29 on the Intel Xeon,
# session 14").
CPU_SAMPLES_PIECE_BYTES = CPU_HEAP_PIECE_BYTES


def pair(value: int | Sequence[int]) -> tuple[int, int]:
    """``(value, value)`` for an int, else the two values as ints."""
    if isinstance(value, int):
        return value, value
    a, b = value
    return int(a), int(b)


def _kv_halves(deformable_groups: int) -> int:
    """Parts the kv channels are sampled in: keys and values apart (2) where no deformable group holds both."""
    return 2 if deformable_groups % 2 == 0 else 1


def kv_parts(keys: Tensor, values: Tensor, deformable_groups: int) -> tuple[Tensor, ...]:
    """The kv tensors :func:`attend` samples, from the key and value projections (each (..., C, H, W)): apart where
    ``_kv_halves`` is 2 (no copy), else concatenated along the channels."""
    return (keys, values) if _kv_halves(deformable_groups) == 2 else (torch.cat([keys, values], dim=-3),)


def clip_frames(x: Tensor, clip_size: int) -> Tensor:
    """(N, clip_size, C, H, W) -> (N * clip_size, clip_size, C, H, W): query frame j of clip i attends to the clip's
    frames (j + n) % clip_size, n = 0..clip_size-1 (the reference operator's order). One contiguous copy, whatever
    x's layout."""
    n, clip, c, h, w = x.shape
    j = torch.arange(clip_size, device=x.device)
    order = (j.view(-1, 1) + j.view(1, -1)) % clip_size  # (clip_j, clip_n)
    # index_select, not advanced indexing: its backward (index_add) sums in a fixed order at any thread count
    return x.index_select(1, order.flatten()).reshape(n * clip_size, clip_size, c, h, w)


def _attend_frames(
    q: Tensor,
    kv_parts: tuple[Tensor, ...],
    offset: Tensor,
    kernel: tuple[int, int],
    stride: tuple[int, int],
    padding: tuple[int, int],
    dilation: tuple[int, int],
    attention_heads: int,
    deformable_groups: int,
) -> Tensor:
    """Deformable attention of each query frame over its own stack of kv frames (no dtype handling).

    With an even number of deformable groups the keys (the first half of the groups) and the values are sampled by
    two calls, each into a tensor half the size of all samples: where no gradient is recorded the keys are freed
    before the values are sampled (on the CPU in pieces of whole heads, :func:`_attend_in_pieces`), and in backward
    each half's gradient is its own tensor. Below glibc's largest mmap threshold (32 MiB) such halves come from reused
    heap blocks; the whole samples (RVRT tiny: 54 MiB a call) were mapped afresh and faulted in page by page on every
    call (benchmarks/RESULTS.md, "RVRT speed by profiling, session 6"). The same values: grid_sample samples each
    channel on its own.

    Args:
        q: (B, C, H, W) queries.
        kv_parts: the S kv frames each query attends to, (B, S, 2C, H, W), split along channels into
            ``_kv_halves(G)`` parts (keys, values), each (B, S, 2C / parts, H, W) and best contiguous (sampled
            without a copy).
        offset: (B, S * G * kh * kw * 2, H, W), (dy, dx) per frame, group and kernel point.

    Returns:
        (B, C, H, W).
    """
    halves = len(kv_parts)
    b, s, _, h, w = kv_parts[0].shape
    c2 = sum(p.shape[2] for p in kv_parts)
    kh, kw = kernel
    kk = kh * kw
    g = deformable_groups
    heads = attention_heads
    hd = c2 // 2 // heads
    hw = h * w
    dev, dt = q.device, q.dtype
    # base sampling positions (kk, H*W) in pixel indices
    ys = torch.arange(h, device=dev, dtype=dt) * stride[0] - padding[0]
    xs = torch.arange(w, device=dev, dtype=dt) * stride[1] - padding[1]
    ki = torch.arange(kh, device=dev, dtype=dt) * dilation[0]
    kj = torch.arange(kw, device=dev, dtype=dt) * dilation[1]
    base_y = (ki.view(kh, 1, 1, 1) + ys.view(1, 1, h, 1)).expand(kh, kw, h, w).reshape(kk, hw)
    base_x = (kj.view(1, kw, 1, 1) + xs.view(1, 1, 1, w)).expand(kh, kw, h, w).reshape(kk, hw)
    # positions (B, S, halves, G / halves, kk, (y, x), HW) in pixel indices, normalised in place to grid_sample's
    # [-1, 1] as (2 p + 1) / size - 1 (the same ops, and bits, as one axis at a time), then stacked (x, y) last
    # with the halves first, so that each half's grid is contiguous
    base = torch.stack((base_y, base_x), dim=1)  # (kk, 2, HW)
    size = torch.tensor([h, w], device=dev, dtype=dt).view(2, 1)
    pos = (offset.reshape(b, s, halves, g // halves, kk, 2, hw) + base).mul_(2).add_(1).div_(size).sub_(1)
    # unbind, not two selects: in backward each select would write its gradient into a zero-filled tensor of the
    # whole input and the two be summed; unbind's backward stacks them once
    pos_y, pos_x = (p.movedim(2, 0) for p in pos.unbind(5))
    grids = torch.stack((pos_x, pos_y), dim=-1).unbind(0)  # halves x (B, S, G / halves, kk, HW, 2)

    def sample(part: int, lo: int = 0, hi: int = g // halves, first: int = 0, last: int = hw) -> Tensor:
        """Keys, values (or both, for an odd G) of kv part ``part``, groups ``lo:hi`` of it, at the query pixels
        ``first:last``: (B, S, hi - lo, 2C / G, kk, last - first)."""
        n, pixels = hi - lo, last - first
        groups = b * s * n
        cols = grid_sample(
            kv_parts[part].reshape(b, s, g // halves, c2 // g, h, w)[:, :, lo:hi].reshape(groups, c2 // g, h, w),
            grids[part][:, :, lo:hi, :, first:last].reshape(groups, kk, pixels, 2),
            mode='bilinear',
            padding_mode='zeros',
            align_corners=False,
        )  # (B*S*n, 2C/G, kk, pixels)
        return cols.view(b, s, n, c2 // g, kk, pixels)

    # contiguous: the queries come channels-last from their projection, and every product of the attention reads
    # them along the pixels (strided, the core took 1.07x as long at the released size 001)
    qh = q.contiguous().view(b, 1, heads, hd, 1, hw) * hd**-0.5
    if halves == 1:
        keys, values = sample(0).view(b, s, 2, heads, hd, kk, hw).unbind(2)
    elif torch.is_grad_enabled():
        keys, values = sample(0).view(b, s, heads, hd, kk, hw), sample(1).view(b, s, heads, hd, kk, hw)
    else:
        out = _attend_in_pieces(sample, qh, (b, s, heads, hd, kk, hw), g // halves, c2 // g)
        return out.reshape(b, heads * hd, h, w)
    if torch.is_grad_enabled() and not torch.compiler.is_compiling():
        out = _AttendSampled.apply(keys, values, qh)
    else:
        out = _weighted_values(values, _attention_weights(keys, qh))
    return out.reshape(b, heads * hd, h, w)


def _pieces(shape: tuple[int, ...], groups: int, group_channels: int,
            budget: int | None) -> tuple[list[tuple[int, int, int, int]], int]:
    """Plan the attention's pieces: whole key/value groups and whole heads ``(g0, g1, e0, e1)`` (groups ``g0:g1`` of
    each part, heads ``e0:e1``), each piece's samples (of the keys or the values) at most ``budget`` elements, and the
    run of query pixels a piece is taken in when one piece alone exceeds it (one group at a large tile).

    Args:
        shape: (B, S, heads, hd, kk, HW) of the keys (or values).
        groups: deformable groups of each part (G / 2).
        group_channels: channels of a group (2C / G).
        budget: elements a piece's samples may hold; None for one piece of every pixel.

    Returns:
        (pieces, span): the pieces in order, and the number of query pixels taken at a time.
    """
    b, s, heads, hd, kk, hw = shape
    if budget is None:
        return [(0, groups, 0, heads)], hw
    unit = math.lcm(group_channels, hd)  # the fewest channels that hold whole groups and whole heads
    unit_groups, unit_heads, units = unit // group_channels, unit // hd, groups * group_channels // unit
    step = max(1, min(units, budget // (b * s * unit * kk * hw)))
    pieces = [(first * unit_groups, min(units, first + step) * unit_groups,
               first * unit_heads, min(units, first + step) * unit_heads) for first in range(0, units, step)]
    span = max(1, min(hw, budget // (b * s * step * unit * kk)))
    return pieces, span


def _attend_in_pieces(sample: Callable[..., Tensor], qh: Tensor, shape: tuple[int, ...], groups: int,
                      group_channels: int) -> Tensor:
    """The attention without autograd for keys and values sampled apart (even G), in the pieces of :func:`_pieces`:
    each piece's keys are sampled, turned into weights and freed before its values are sampled. On the CPU (outside
    a graph being recorded, :func:`~models.layers_conv.in_graph`) a piece's samples are at most
    :data:`CPU_SAMPLES_PIECE_BYTES`; elsewhere all is one piece.

    The released RVRTs' samples are 96 MiB a call at 48 x 48 and 680 MiB in a 128 x 128 tile; pieces of
    :data:`~models.layers_conv.CPU_HEAP_PIECE_BYTES` come from reused heap memory instead. Every head and pixel is
    computed by the same ops as in one piece, so the output has the same bits.

    Args:
        sample: ``sample(part, lo, hi, first, last)``, kv part 0 (keys) or 1 (values) of key/value groups
            ``lo:hi`` at the query pixels ``first:last``, (B, S, hi - lo, group_channels, kk, last - first).
        qh: (B, 1, heads, hd, 1, HW) scaled queries.
        shape: (B, S, heads, hd, kk, HW).
        groups: deformable groups of each part (G / 2).
        group_channels: channels of a group (2C / G).

    Returns:
        (B, heads, hd, HW).
    """
    b, s, heads, hd, kk, hw = shape
    budget = CPU_SAMPLES_PIECE_BYTES // qh.element_size() if qh.device.type == 'cpu' and not in_graph() else None
    pieces, span = _pieces(shape, groups, group_channels, budget)
    if len(pieces) == 1 and span == hw:
        attn = _attention_weights(sample(0).view(shape), qh)
        return _weighted_values(sample(1).view(shape), attn)
    out = qh.new_empty(b, heads, hd, hw)
    for g0, g1, e0, e1 in pieces:
        for first in range(0, hw, span):
            last = min(hw, first + span)
            piece = (b, s, e1 - e0, hd, kk, last - first)
            attn = _attention_weights(sample(0, g0, g1, first, last).view(piece), qh[:, :, e0:e1, ..., first:last])
            _weighted_values(sample(1, g0, g1, first, last).view(piece), attn, out=out[:, e0:e1, :, first:last])
    return out


def _attention_weights(keys: Tensor, qh: Tensor) -> Tensor:
    """Softmax over the sampled keys of each pixel's query: (B, heads, S * kk, HW).

    Products and sums over the small axes (head_dim here, frames x kernel points in :func:`_weighted_values`) in
    the sampled layout, pixels innermost: a batched matrix product (einsum) would first copy the samples into a
    pixel-major layout, which cost more than the products (1.3-1.4x slower forward and backward,
    benchmarks/RESULTS.md).

    Args:
        keys: (B, S, heads, hd, kk, HW) sampled keys.
        qh: (B, 1, heads, hd, 1, HW) scaled queries.
    """
    b, s, heads, hd, kk, hw = keys.shape
    logits = _mul_sum((keys[:, :, :, d], qh[:, :, :, d]) for d in range(hd))  # (B, S, heads, kk, HW)
    return logits.transpose(1, 2).reshape(b, heads, s * kk, hw).softmax(dim=2)


def _weighted_values(values: Tensor, attn: Tensor, out: Tensor | None = None) -> Tensor:
    """The attention-weighted sum of the sampled values: values (B, S, heads, hd, kk, HW), attn (B, heads, S * kk,
    HW) -> (B, heads, hd, HW), written into ``out`` where given (no autograd)."""
    b, s, heads, hd, kk, hw = values.shape
    weights = attn.view(b, heads, s, kk, 1, hw)
    return _mul_sum(((values[:, i, :, :, k], weights[:, :, i, k]) for i in range(s) for k in range(kk)), out)


def _mul_sum(pairs: Iterable[tuple[Tensor, Tensor]], out: Tensor | None = None) -> Tensor:
    """``sum(a * b for a, b in pairs)`` as running multiply-adds into the first product, in the pairs' order
    (into ``out`` where given).

    Each sum of the attention and its backward runs over a small axis one slice at a time: a product of the whole
    samples' size, then its sum, wrote and read back the largest tensor of the call (1.9x slower)."""
    pairs = iter(pairs)
    a, b = next(pairs)
    total = a * b if out is None else torch.mul(a, b, out=out)
    for a, b in pairs:
        total.addcmul_(a, b)
    return total


class _AttendSampled(torch.autograd.Function):
    """:func:`_attention_weights` then :func:`_weighted_values`, with the backward written out: each gradient of
    the samples is written once into a tensor of its own (autograd of the products would write zero-filled
    tensors and sum them), and the sums run as in the forward, multiply-adds one slice at a time."""

    @staticmethod
    def forward(ctx, keys: Tensor, values: Tensor, qh: Tensor) -> Tensor:
        attn = _attention_weights(keys, qh)
        ctx.save_for_backward(keys, values, qh, attn)
        return _weighted_values(values, attn)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        keys, values, qh, attn = ctx.saved_tensors
        b, s, heads, hd, kk, hw = keys.shape
        grad = grad_out.view(b, 1, heads, hd, 1, hw)
        attn_b = attn.view(b, heads, s, kk, hw).transpose(1, 2).unsqueeze(3)  # (B, S, heads, 1, kk, HW)
        # written into tensors of the samples' own (contiguous) layout: a product would take the broadcast operands'
        # order, and autograd then copy it for the samples' views
        grad_values = torch.mul(grad, attn_b, out=torch.empty_like(values))
        grad_attn = _mul_sum((values[:, :, :, d], grad[:, :, :, d]) for d in range(hd))  # (B, S, heads, kk, HW)
        grad_attn = grad_attn.transpose(1, 2).reshape(b, heads, s * kk, hw)
        grad_logits = torch._softmax_backward_data(grad_attn, attn, 2, attn.dtype)
        grad_logits = grad_logits.view(b, heads, s, kk, hw).transpose(1, 2).unsqueeze(3)  # (B, S, heads, 1, kk, HW)
        grad_keys = torch.mul(grad_logits, qh, out=torch.empty_like(keys))
        grad_qh = _mul_sum((keys[:, i, :, :, k], grad_logits[:, i, :, :, k])
                           for i in range(s) for k in range(kk))  # (B, heads, hd, HW)
        return grad_keys, grad_values, grad_qh.view(qh.shape)


def work_dtype(t: Tensor) -> torch.dtype:
    """float64 stays float64; everything else (fp32, bf16, fp16) is computed in float32."""
    return torch.float64 if t.dtype == torch.float64 else torch.float32


def attend(q: Tensor, kv: tuple[Tensor, ...], offset: Tensor, params: tuple, recompute: bool | None,
           compile: bool) -> Tensor:
    """The operator's core with its dtype/autocast policy, optional torch.compile and backward recomputation.

    Args:
        q: (B, C, H, W) queries (B = N * clip_size).
        kv: :func:`kv_parts` of the keys and values, each arranged by :func:`clip_frames`.
        offset: (B, clip_size * G * kh * kw * 2, H, W).
        params: ``((kh, kw), stride, padding, dilation, attention_heads, deformable_groups)``, pairs for the middle
            three.
        recompute, compile: see :func:`deform_attn`.

    Returns:
        (B, C, H, W) in ``q``'s dtype.
    """
    out_dtype = q.dtype
    work = work_dtype(q)
    fn = _attend_frames
    if compile:
        if 'fn' not in _COMPILED:
            _COMPILED['fn'] = torch.compile(_attend_frames, dynamic=True)
        fn = _COMPILED['fn']  # type: ignore[assignment]
    with autocast_off(q.device):
        parts = tuple(p.to(work) for p in kv)
        args = (q.to(work), parts, offset.to(work), *params)
        needs_grad = torch.is_grad_enabled() and any(t.requires_grad for t in (args[0], *parts, args[2]))
        if recompute is None:  # by the bytes of the sampled keys/values, kh * kw samples of each kv frame
            kh, kw = params[0]
            recompute = sum(p.numel() for p in parts) * kh * kw * parts[0].element_size() > RECOMPUTE_ABOVE_BYTES
        if needs_grad and recompute:
            out = checkpoint(fn, *args, use_reentrant=False)
        else:
            out = fn(*args)
    return out.to(out_dtype)


def _check(cond: bool, message: str) -> None:
    if not cond:
        raise ValueError(f'deform_attn: {message}')


def deform_attn(
    q: Tensor,
    kv: Tensor,
    offset: Tensor,
    kernel_h: int,
    kernel_w: int,
    stride: int = 1,
    padding: int = 0,
    dilation: int = 1,
    attention_heads: int = 1,
    deformable_groups: int = 1,
    clip_size: int = 1,
    *,
    recompute: bool | None = None,
    compile: bool = False,
) -> Tensor:
    """Guided deformable attention with the reference CUDA operator's semantics (see the module docstring).

    Args:
        q: (N * clip_size, ..., C, H, W) queries, e.g. (B, 1, C, H, W) or (B, C, H, W).
        kv: (N, clip_size, 2C, H, W) keys then values.
        offset: (N * clip_size, clip_size * deformable_groups * kernel_h * kernel_w * 2, H, W), (dy, dx) pairs.
        kernel_h, kernel_w: attention window.
        stride, padding, dilation: window placement, as in a convolution (the output keeps q's H x W).
        attention_heads: heads; C must be divisible by it.
        deformable_groups: offset groups over the 2C kv channels; 2C must be divisible by it.
        clip_size: kv frames per clip.
        recompute: recompute the sampling in backward instead of storing it (default: where the sampled keys
            and values exceed :data:`RECOMPUTE_ABOVE_BYTES`).
        compile: run the core through ``torch.compile`` (a speed option; same results up to rounding).

    Returns:
        Tensor with ``q``'s shape and dtype.
    """
    _check(kv.dim() == 5, f'kv must be (N, clip_size, 2C, H, W), got shape {tuple(kv.shape)}')
    check_shapes(q, tuple(kv.shape), offset, kernel_h, kernel_w, attention_heads, deformable_groups, clip_size)
    parts = tuple(clip_frames(p, clip_size) for p in kv.chunk(_kv_halves(deformable_groups), dim=2))
    params = ((kernel_h, kernel_w), pair(stride), pair(padding), pair(dilation), attention_heads,
              deformable_groups)
    b, _, c2, h, w = parts[0].shape
    out = attend(q.reshape(b, c2 * len(parts) // 2, h, w), parts, offset, params, recompute, compile)
    return out.view(q.shape)


def check_shapes(q: Tensor, kv_shape: tuple[int, ...], offset: Tensor, kernel_h: int, kernel_w: int,
                  attention_heads: int, deformable_groups: int, clip_size: int) -> None:
    """Refuse, in one line each, arguments :func:`deform_attn` cannot compute (``kv_shape``: (N, clip, 2C, H, W))."""
    n, clip, c2, h, w = kv_shape
    _check(clip == clip_size, f'kv has {clip} frames per clip but clip_size={clip_size}')
    _check(c2 % 2 == 0, f'kv channels must be 2C (keys then values), got {c2}')
    c = c2 // 2
    b = q.shape[0]
    _check(b == n * clip_size and q.numel() == b * c * h * w,
           f'q must hold N*clip_size={n * clip_size} frames of (C={c}, H={h}, W={w}), got shape {tuple(q.shape)}')
    _check(c % attention_heads == 0, f'C={c} is not divisible by attention_heads={attention_heads}')
    _check(c2 % deformable_groups == 0, f'2C={c2} is not divisible by deformable_groups={deformable_groups}')
    per_block = deformable_groups * kernel_h * kernel_w * 2
    _check(tuple(offset.shape) == (b, clip_size * per_block, h, w),
           f'offset must be {(b, clip_size * per_block, h, w)}, got {tuple(offset.shape)}')
