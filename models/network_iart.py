"""IART: video super-resolution with implicit resampling-based alignment (Xu et al., CVPR 2024).

Constructor arguments, defaults, module names, parameter shapes and persistent buffers follow the official
implementation (github.com/kai422/IART, ``archs/iart_arch.py``, ``implicit_alignment.py``,
``psrt_sliding_arch.py``), so its released ``{'params': ...}`` checkpoints load with ``strict=True``.

The network: per-frame 3x3 features (``conv_first``), SpyNet flows between neighbours, four propagation branches
(backward, forward, backward, forward; each branch reads the previous one's features) and an x4 pixel-shuffle head
on the last branch's features plus a bilinear skip. At every step of a branch, the features of the previous step
(and of the step before, through the composed flow) are aligned to the current frame by :class:`ImplicitWarp`
(each pixel attends to the 2x2 integer neighbours of its flow target, with sine position encodings of the
sub-pixel offset), and a Swin transformer (:class:`PropagationTransformer`) over the three frames ``[aligned
previous, current, aligned second previous]`` gives the branch's feature of the current frame.

Differences from the official code, none of which changes the fp32 numerics (equality measured in
``tests/test_network_iart.py``):

* it runs on any device: the official builds its transformers only when CUDA is available, makes position-encoding
  frequencies with ``device='cuda'`` and moves cached features with ``.cuda()``;
* long clips (``T > cpu_cache_length``) on a non-CPU device keep features and flows on the CPU and compute on the
  input's device, in training too; the output comes back on the input's device (the official returns it on the
  CPU, and fails on a mirror-extended clip in that mode);
* the mirror-extension test is done per forward (the official sets a flag once and never resets it);
* window attention through ``F.scaled_dot_product_attention`` (:func:`models.layers_sdpa.attention`); shifted
  windows are gathered (shift, partition and grouping by mask pattern in one ``index_select``) and each group of
  windows attends with its pattern broadcast, instead of a (windows x heads x N x N) bias; the implicit alignment
  gathers the 2x2 neighbours with one ``index_select`` (the official ``gather``\\s a copy of the index per channel)
  and attends over them with elementwise products (one query, four keys per pixel); sampling positions and
  offsets are computed in fp32 under autocast (bf16 cannot hold pixel coordinates), SpyNet runs in fp32 with
  autocast off;
* only the previous branch's features are kept while a branch runs (the official keeps all four lists);
* activation checkpointing (``use_checkpoint``, per branch, as the official) is non-reentrant: it works under DDP
  without ``static_graph`` (the official's README asks users to restart training by hand after 5,000 steps);
* the parameters the official builds but never uses (each transformer's ``conv_first``, ``conv_first_feat`` and
  ``conv_before_upsample`` at ``embed_dim`` 120) stay in the state dict but do not require gradients, so DDP needs
  no ``find_unused_parameters``;
* ``drop_path_rate`` (the official hard-codes 0.1) is an argument, with the official value as default.

Input (N, T, 3, H, W) RGB in [0, 1] with H, W >= 64 (the official asserts it; :data:`MIN_LQ_SIZE`); output
(N, T, 3, 4H, 4W).
"""

from __future__ import annotations

import logging
import math
import os
from collections import OrderedDict
from collections.abc import Sequence
from typing import NamedTuple

import torch
import torch.nn.functional as F
from timm.layers import DropPath, Mlp, trunc_normal_
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from models.layers_sdpa import attention
from models.layers_warp import autocast_off, flow_warp
from models.layers_window import compute_mask, relative_position_index, window_partition, window_reverse
from models.net_io import NetIO
from models.network_spynet import SpyNet, neighbour_flows

logger = logging.getLogger(__name__)

BRANCHES = ('backward_1', 'forward_1', 'backward_2', 'forward_2')
MIN_LQ_SIZE = 64  # the official asserts low-resolution frames of at least 64 x 64
STACK_FRAMES = 3  # each propagation step attends over [aligned previous, current, aligned second previous]
CACHE_CHUNK_PIXELS = 64 * 64 * 16  # LQ pixels per chunk of conv_first and SpyNet in cache mode (16 frames of 64 x 64)
PE_TEMPERATURE = 0.01  # the official ``ImplicitWarpModule(pe_temp=0.01)``
ALIGN_WINDOW = 2  # the official implicit alignment attends over the 2 x 2 integer neighbours of each target


# ------------------------------------------------------------------------------------------ position encoding
def _frequencies(num_pos_feats: int, temperature: float, device: torch.device | None = None) -> Tensor:
    """``temperature ** (2 * (i // 2) / num_pos_feats)``, i < num_pos_feats, float32 (the official's dtype, also in
    a float64 network)."""
    dim_t = torch.arange(num_pos_feats, dtype=torch.float32, device=device)
    return temperature ** (2 * torch.div(dim_t, 2, rounding_mode='trunc') / num_pos_feats)


def _sine(embed: Tensor, dim_t: Tensor) -> Tensor:
    """(...,) positions in radians -> (..., F): ``sin`` of the even features interleaved with ``cos`` of the odd."""
    pos = embed[..., None] / dim_t
    return torch.stack((pos[..., 0::2].sin(), pos[..., 1::2].cos()), dim=-1).flatten(-2)


def window_position_encoding(window: int, num_pos_feats: int, temperature: float) -> Tensor:
    """The sine encoding of the integer positions of a ``window x window`` grid, each axis scaled to [0, 2 pi].

    Returns:
        (1, window * window, 2 * num_pos_feats) float32: y features then x features, positions row-major.
    """
    ones = torch.ones(1, window, window)
    y = ones.cumsum(1, dtype=torch.float32) - 1
    x = ones.cumsum(2, dtype=torch.float32) - 1
    y = y / (y[:, -1:, :] + 1e-6) * (2 * math.pi)
    x = x / (x[:, :, -1:] + 1e-6) * (2 * math.pi)
    dim_t = _frequencies(num_pos_feats, temperature)
    return torch.cat((_sine(y, dim_t), _sine(x, dim_t)), dim=-1).flatten(1, 2).contiguous()


def offset_position_encoding(offset: Tensor, window: int, num_pos_feats: int, temperature: float) -> Tensor:
    """The sine encoding of sub-pixel offsets, each axis scaled by ``2 pi / window``.

    Args:
        offset: (..., 2) offsets (dy, dx) in [0, 1).

    Returns:
        (..., 2 * num_pos_feats) in ``offset``'s dtype: y features then x features.
    """
    dim_t = _frequencies(num_pos_feats, temperature, offset.device)
    y = offset[..., 0] / (window + 1e-6) * (2 * math.pi)
    x = offset[..., 1] / (window + 1e-6) * (2 * math.pi)
    return torch.cat((_sine(y, dim_t), _sine(x, dim_t)), dim=-1)


# ------------------------------------------------------------------------------------------ implicit alignment
class ImplicitWarp(nn.Module):
    """Implicit alignment: each pixel of the current frame attends to the 2x2 integer neighbours of its flow target
    in the frame to align (the official ``ImplicitWarpModule`` with its IART settings: duplicate padding, position
    encodings on both sides, no auxiliary output).

    Query: the current frame's feature plus the sine encoding of the target's sub-pixel offset; keys and values: the
    neighbours' features plus the encoding of their integer positions in the window (buffer ``position_bias``).

    Args:
        dim: feature channels (also the position-encoding width; divisible by 4 and by ``num_heads``).
        num_heads: attention heads.
        window_size: neighbours per axis (the official uses 2).
        pe_temp: temperature of the sine encodings.
        qkv_bias: biases in the q, k, v projections.
    """

    def __init__(self, dim: int, num_heads: int, window_size: int = ALIGN_WINDOW, pe_temp: float = PE_TEMPERATURE,
                 qkv_bias: bool = True) -> None:
        super().__init__()
        if dim % num_heads or dim % 4:
            raise ValueError(f'ImplicitWarp: dim {dim} must be divisible by num_heads ({num_heads}) and by 4 (sine '
                             'encodings of two axes, sin and cos)')
        self.dim, self.num_heads, self.window, self.pe_temp = dim, num_heads, window_size, pe_temp
        self.scale = (dim // num_heads) ** -0.5
        self.q = nn.Linear(dim, dim, bias=qkv_bias)
        self.k = nn.Linear(dim, dim, bias=qkv_bias)
        self.v = nn.Linear(dim, dim, bias=qkv_bias)
        self.register_buffer('position_bias', window_position_encoding(window_size, dim // 2, pe_temp))
        grid = torch.meshgrid(torch.arange(window_size), torch.arange(window_size), indexing='ij')
        self.register_buffer('window_idx_offset', torch.stack(grid, 2).reshape(window_size ** 2, 2))

    def forward(self, y: Tensor, x: Tensor, flow: Tensor) -> Tensor:
        """Align ``y`` to ``x``.

        Args:
            y: (N, C, H, W) features to align (the previous step's).
            x: (N, C, H, W) features of the current frame.
            flow: (N, 2, H, W) flow (dx, dy) from ``x``'s pixels to their positions in ``y``.

        Returns:
            (N, H, W, C) aligned features, channels-last.
        """
        n, c, h, w = x.shape
        k2 = self.window ** 2
        work = torch.float64 if torch.float64 in (x.dtype, flow.dtype) else torch.float32
        rows = torch.arange(h, dtype=work, device=x.device).view(1, h, 1) + flow[:, 1].to(work)
        cols = torch.arange(w, dtype=work, device=x.device).view(1, 1, w) + flow[:, 0].to(work)
        rows_floor, cols_floor = rows.floor(), cols.floor()
        offset = torch.stack((rows - rows_floor, cols - cols_floor), dim=-1).view(n, h * w, 2)
        # the window's integer neighbours, clamped into the frame ('duplicate' padding), as rows of (N * H * W, C)
        top = rows_floor.long().view(n, h * w, 1) + self.window_idx_offset[:, 0]
        left = cols_floor.long().view(n, h * w, 1) + self.window_idx_offset[:, 1]
        index = top.clamp(0, h - 1) * w + left.clamp(0, w - 1)
        index = index + torch.arange(n, device=x.device).view(n, 1, 1) * (h * w)
        y_rows = y.permute(0, 2, 3, 1).reshape(n * h * w, c)
        neighbours = y_rows.index_select(0, index.reshape(-1)).view(n * h * w, k2, c)
        neighbours = neighbours + self.position_bias.view(1, k2, c)  # promoted to fp32 under autocast, as the official

        x_pe = offset_position_encoding(offset, self.window, c // 2, self.pe_temp)  # (N, HW, C)
        query = x.permute(0, 2, 3, 1).reshape(n * h * w, c) + x_pe.view(n * h * w, c)
        heads, hd = self.num_heads, c // self.num_heads
        q = self.q(query).view(n * h * w, 1, heads, hd)
        k = self.k(neighbours).view(n * h * w, k2, heads, hd)
        v = self.v(neighbours).view(n * h * w, k2, heads, hd)
        # one query and k2 keys per pixel and head: elementwise products beat a batch of (1 x k2) matmuls
        scores = ((q * self.scale) * k).sum(-1)  # (NHW, k2, heads)
        probs = scores.float().softmax(dim=1).to(v.dtype) if scores.dtype != torch.float64 else scores.softmax(1)
        out = (probs.unsqueeze(-1) * v).sum(1)  # (NHW, heads, hd)
        return out.view(n, h, w, c)


# ------------------------------------------------------------------------------------------ Swin transformer
class ShiftedWindows(NamedTuple):
    """How the tokens of one padded size go into shifted windows, grouped by mask pattern.

    One ``index_select`` does the cyclic shift, the window partition and the grouping: the windows of a group are
    consecutive, and each group attends with ``bias + its pattern`` broadcast over its windows (the fused kernel's
    fast form: a few patterns, the windows inside the frame having none, instead of a (windows x heads x N x N) bias
    and its gradient). Another ``index_select`` puts the tokens back.

    Attributes:
        gather: (B * D * H * W,) token rows of (B, D, H, W, C) in window order (shifted, partitioned, grouped).
        scatter: the inverse permutation.
        groups: ``(windows, pattern)`` of each group in order; pattern (N, N) additive (0 / -100), ``None`` for none.
    """

    gather: Tensor
    scatter: Tensor
    groups: list[tuple[int, Tensor | None]]


_SHIFTED: OrderedDict[tuple, ShiftedWindows] = OrderedDict()
_SHIFTED_MAX = 32


def shifted_windows(size: tuple[int, int, int], window: tuple[int, int, int], shift: tuple[int, int, int],
                    batch: int, device: torch.device) -> ShiftedWindows:
    """The :class:`ShiftedWindows` of ``batch`` samples of a padded ``size`` (multiples of ``window``), cached per
    size: the masks are :func:`models.layers_window.compute_mask`'s, grouped on the CPU."""
    key = (size, window, shift, batch, device)
    if key in _SHIFTED:
        _SHIFTED.move_to_end(key)
        return _SHIFTED[key]
    with torch.inference_mode(False), torch.device('cpu'):  # one made in validation serves training after it
        mask = compute_mask(*size, window, shift, torch.device('cpu'))
        nw, n = mask.shape[:2]
        unique, inverse = torch.unique(mask.flatten(1), dim=0, return_inverse=True)
        per_window = inverse.repeat(batch)  # group of each window of the batch
        order = torch.argsort(per_window, stable=True)
        tokens = torch.arange(batch * math.prod(size)).view(batch, *size, 1)
        tokens = torch.roll(tokens, shifts=tuple(-s for s in shift), dims=(1, 2, 3))
        gather = window_partition(tokens, window).view(batch * nw, n).index_select(0, order).flatten()
        counts = torch.bincount(per_window, minlength=len(unique)).tolist()
        groups = [(count, row.view(n, n).to(device) if row.any() else None)
                  for count, row in zip(counts, unique) if count]
        entry = ShiftedWindows(gather.to(device), torch.argsort(gather).to(device), groups)
    _SHIFTED[key] = entry
    if len(_SHIFTED) > _SHIFTED_MAX:
        _SHIFTED.popitem(last=False)
    return entry


class WindowAttention3D(nn.Module):
    """Window self-attention with a relative position bias (the official's names: ``qkv``, ``proj``,
    ``relative_position_bias_table``, ``relative_position_index``).

    Args:
        dim: channels.
        window_size: (Wd, Wh, Ww).
        num_heads: attention heads.
        qkv_bias: bias in the qkv projection.
    """

    def __init__(self, dim: int, window_size: Sequence[int], num_heads: int, qkv_bias: bool = True) -> None:
        super().__init__()
        self.window_size = tuple(window_size)
        self.num_heads = num_heads
        self.scale = (dim // num_heads) ** -0.5
        wd, wh, ww = self.window_size
        self.relative_position_bias_table = nn.Parameter(torch.zeros((2 * wd - 1) * (2 * wh - 1) * (2 * ww - 1),
                                                                     num_heads))
        self.register_buffer('relative_position_index', relative_position_index(self.window_size))
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        self.proj = nn.Linear(dim, dim)
        trunc_normal_(self.relative_position_bias_table, std=0.02)

    def forward(self, x: Tensor, groups: Sequence[tuple[int, Tensor | None]] = ()) -> Tensor:
        """Attention inside each window.

        Args:
            x: (B * nW, N, C) window tokens.
            groups: ``(windows, pattern)`` of consecutive groups of windows (shifted windows: each group's shift
                mask); empty: no mask.

        Returns:
            (B * nW, N, C).
        """
        b_, n, c = x.shape
        h = self.num_heads
        q, k, v = self.qkv(x).view(b_, n, 3, h, c // h).permute(2, 0, 3, 1, 4).unbind(0)  # (B_, h, N, hd)
        # index_select: a backward that sums in a fixed order (advanced indexing accumulates with atomics)
        index = self.relative_position_index[:n, :n].reshape(-1)
        bias = self.relative_position_bias_table.index_select(0, index).view(n, n, h).permute(2, 0, 1)[None]
        if not groups:
            out = self._attend(q, k, v, bias)
        else:
            sizes = [count for count, _ in groups]
            outs = [self._attend(qg, kg, vg, bias if pattern is None else bias + pattern)
                    for qg, kg, vg, (_, pattern) in zip(q.split(sizes), k.split(sizes), v.split(sizes), groups)]
            out = torch.cat(outs)
        return self.proj(out.transpose(1, 2).reshape(b_, n, c))

    def _attend(self, q: Tensor, k: Tensor, v: Tensor, bias: Tensor) -> Tensor:
        """(B, h, N, hd) each, bias (1, h, N, N) broadcast over B -> (B, h, N, hd)."""
        # ONNX: the fused call's form would fold an expanded bias per block. Everywhere else the fused kernel, in CPU
        # training too: attention()'s bias backward recomputes the probabilities in chunks of whole windows, which
        # beats keeping them from a plain softmax(q k^T + bias) v (a released-size transformer's train step 3.1 s
        # against 4.8 s: the plain form's (windows x heads x N x N) scores, sums and softmax went through memory)
        if torch.onnx.is_in_onnx_export():
            return ((q * self.scale) @ k.transpose(-2, -1) + bias.to(q.dtype)).softmax(dim=-1) @ v
        return attention(q, k, v, bias.to(q.dtype), self.scale)


class SwinBlock(nn.Module):
    """Pre-norm (shifted) window attention and a GELU MLP, channels-last (B, T, H, W, C); the input is zero-padded
    to window multiples after ``norm1`` (the official's order).

    Args:
        dim, num_heads: channels and heads.
        window_size: (Wd, Wh, Ww).
        shift_size: cyclic shift (0, 0, 0) or (Wd, Wh // 2, Ww // 2) (the official shifts the frame axis by a whole
            window, a no-op when the frames fill one window).
        mlp_ratio: MLP hidden / dim.
        drop_path: stochastic depth rate.
    """

    def __init__(self, dim: int, num_heads: int, window_size: Sequence[int], shift_size: Sequence[int],
                 mlp_ratio: float = 2.0, drop_path: float = 0.0) -> None:
        super().__init__()
        self.window_size, self.shift_size = tuple(window_size), tuple(shift_size)
        self.norm1 = nn.LayerNorm(dim)
        self.attn = WindowAttention3D(dim, self.window_size, num_heads)
        self.drop_path = DropPath(drop_path) if drop_path > 0 else nn.Identity()
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = Mlp(dim, int(dim * mlp_ratio))

    @property
    def shifted(self) -> bool:
        return any(s > 0 for s in self.shift_size)

    def _attn_part(self, x: Tensor, shifted: ShiftedWindows | None) -> Tensor:
        b, t, h, w, c = x.shape
        x = self.norm1(x)
        pads = [(ws - n % ws) % ws for n, ws in zip((t, h, w), self.window_size)]
        if any(pads):
            x = F.pad(x, (0, 0, 0, pads[2], 0, pads[1], 0, pads[0]))
        size = (b, t + pads[0], h + pads[1], w + pads[2])
        if self.shifted and shifted is not None:
            n = math.prod(self.window_size)
            windows = x.reshape(-1, c).index_select(0, shifted.gather).view(-1, n, c)
            x = self.attn(windows, shifted.groups).reshape(-1, c).index_select(0, shifted.scatter).view(*size, c)
        else:
            x = window_reverse(self.attn(window_partition(x, self.window_size)), self.window_size, *size)
        return x[:, :t, :h, :w] if any(pads) else x

    def forward(self, x: Tensor, shifted: ShiftedWindows | None) -> Tensor:
        """x: (B, T, H, W, C); shifted: the shifted windows of the padded size -> (B, T, H, W, C)."""
        x = x + self.drop_path(self._attn_part(x, shifted))
        return x + self.drop_path(self.mlp(self.norm2(x)))


class SwinBlocks(nn.Module):
    """The blocks of one residual group (``blocks.<i>``), alternating unshifted and shifted windows.

    Args:
        dim, depth, num_heads, window_size, mlp_ratio: see :class:`SwinBlock`.
        drop_path: one rate per block.
        use_checkpoint: activation checkpointing (non-reentrant) of each block while autograd records.
    """

    def __init__(self, dim: int, depth: int, num_heads: int, window_size: Sequence[int], mlp_ratio: float,
                 drop_path: Sequence[float], use_checkpoint: bool) -> None:
        super().__init__()
        shift = (window_size[0], window_size[1] // 2, window_size[2] // 2)
        self.use_checkpoint = use_checkpoint
        self.blocks = nn.ModuleList([
            SwinBlock(dim, num_heads, window_size, (0, 0, 0) if i % 2 == 0 else shift, mlp_ratio, drop_path[i])
            for i in range(depth)])

    def forward(self, x: Tensor, shifted: ShiftedWindows | None) -> Tensor:
        """x: (B, T, H, W, C) -> (B, T, H, W, C)."""
        for blk in self.blocks:
            if self.use_checkpoint and torch.is_grad_enabled():
                x = checkpoint(blk, x, shifted, use_reentrant=False)
            else:
                x = blk(x, shifted)
        return x


class ResidualGroup(nn.Module):
    """``x + conv3x3(blocks(x))``, the convolution per frame (the official ``RSTB``: ``residual_group``, ``conv``).

    Args:
        dim, depth, num_heads, window_size, mlp_ratio, drop_path, use_checkpoint: see :class:`SwinBlocks`.
    """

    def __init__(self, dim: int, depth: int, num_heads: int, window_size: Sequence[int], mlp_ratio: float,
                 drop_path: Sequence[float], use_checkpoint: bool) -> None:
        super().__init__()
        self.residual_group = SwinBlocks(dim, depth, num_heads, window_size, mlp_ratio, drop_path, use_checkpoint)
        self.conv = nn.Conv2d(dim, dim, 3, 1, 1)

    def forward(self, x: Tensor, shifted: ShiftedWindows | None) -> Tensor:
        """x: (B, T, H, W, C) -> (B, T, H, W, C)."""
        b, t, h, w, c = x.shape
        y = self.residual_group(x, shifted).reshape(b * t, h, w, c).permute(0, 3, 1, 2)  # channels-last memory
        return x + self.conv(y).permute(0, 2, 3, 1).reshape(b, t, h, w, c)


class LayerNormChannels(nn.Module):
    """LayerNorm over the channels of channels-last tokens (the official ``PatchEmbed`` with ``patch_norm``:
    ``norm``)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)

    def forward(self, x: Tensor) -> Tensor:
        """x: (..., C) -> (..., C)."""
        return self.norm(x)


class PropagationTransformer(nn.Module):
    """The Swin transformer of one propagation branch (the official ``SwinIRFM`` as IART builds it: ``patch_embed``
    LayerNorm, residual groups ``layers.<i>``, ``norm``, ``conv_after_body``).

    It reads the three stacked frames and returns the centre one's feature:
    ``conv_after_body(norm(groups(norm_in(x)))[:, 1]) + x[:, 1]``. The official also builds ``conv_first``
    (3 -> dim), ``conv_first_feat`` (64 -> dim) and ``conv_before_upsample`` (dim -> 64); only an input of 3 or 64
    channels goes through the first two (IART's features have ``embed_dim``), and the third is never used: they
    stay in the state dict, without gradients when unused.

    Args:
        in_chans: image channels (the official ``conv_first``).
        embed_dim: feature channels.
        depths: blocks per residual group.
        num_heads: heads per residual group.
        window_size: (Wd, Wh, Ww).
        mlp_ratio: MLP hidden / dim.
        drop_path_rate: stochastic depth, rising linearly from 0 over all blocks.
        use_checkpoint: activation checkpointing of each block.
    """

    def __init__(self, in_chans: int, embed_dim: int, depths: Sequence[int], num_heads: Sequence[int],
                 window_size: Sequence[int], mlp_ratio: float = 2.0, drop_path_rate: float = 0.1,
                 use_checkpoint: bool = False) -> None:
        super().__init__()
        self.embed_dim = embed_dim
        self.window_size = tuple(window_size)
        self.shift_size = (window_size[0], window_size[1] // 2, window_size[2] // 2)
        self.conv_first = nn.Conv2d(in_chans, embed_dim, 3, 1, 1)
        self.conv_first_feat = nn.Conv2d(64, embed_dim, 3, 1, 1)
        self.patch_embed = LayerNormChannels(embed_dim)
        rates = torch.linspace(0, drop_path_rate, sum(depths), device='cpu').tolist()  # numbers, also on meta
        self.layers = nn.ModuleList([
            ResidualGroup(embed_dim, depth, num_heads[i], window_size, mlp_ratio,
                          rates[sum(depths[:i]):sum(depths[:i + 1])], use_checkpoint)
            for i, depth in enumerate(depths)])
        self.norm = nn.LayerNorm(embed_dim)
        self.conv_after_body = nn.Conv2d(embed_dim, embed_dim, 3, 1, 1)
        self.conv_before_upsample = nn.Conv2d(embed_dim, 64, 3, 1, 1)
        self.apply(self._init_weights)
        # the input has embed_dim channels: conv_first reads 3 and conv_first_feat 64 (the official's rule)
        unused = [self.conv_before_upsample] + [conv for conv, chans in ((self.conv_first, 3),
                                                                        (self.conv_first_feat, 64))
                                                if chans != embed_dim]
        for module in unused:
            module.requires_grad_(False)

    @staticmethod
    def _init_weights(m: nn.Module) -> None:
        if isinstance(m, nn.Linear):
            trunc_normal_(m.weight, std=0.02)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.LayerNorm):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)

    def forward(self, x: Tensor) -> Tensor:
        """x: (N, 3, C, H, W) stacked frames -> (N, C, H, W), the centre frame's new feature."""
        n, t, c, h, w = x.shape
        if c in (3, 64):  # the official's rule (never met by IART's features unless embed_dim is 64)
            conv = self.conv_first if c == 3 else self.conv_first_feat
            x = conv(x.reshape(n * t, c, h, w)).view(n, t, -1, h, w)
        center = x[:, t // 2]
        tokens = self.patch_embed(x.permute(0, 1, 3, 4, 2))  # (N, T, H, W, C)
        padded = tuple(math.ceil(s / ws) * ws for s, ws in zip((t, h, w), self.window_size))
        shifted = shifted_windows(padded, self.window_size, self.shift_size, n, x.device)
        for layer in self.layers:
            tokens = layer(tokens, shifted)
        feat = self.norm(tokens[:, t // 2]).permute(0, 3, 1, 2)  # only the centre frame is read
        return self.conv_after_body(feat) + center


# ------------------------------------------------------------------------------------------ IART
class IART(nn.Module):
    """IART (x4 video super-resolution).

    Args:
        in_channels: input channels (3: RGB; the skip adds the bilinearly upsampled input to the RGB output).
        mid_channels: channels of the upsampling head.
        embed_dim: feature channels of the propagation (divisible by 4 and by every ``num_heads``).
        depths: Swin blocks per residual group of each propagation transformer.
        num_heads: attention heads per residual group (the implicit alignment uses the first).
        window_size: (frames, height, width) of the attention windows.
        num_frames: frames the official builds its shift mask for; each step attends over 3 frames, so it must give
            the same number of frame windows as 3 does.
        img_size: the official's nominal training size (bookkeeping only; any size of at least 64 runs).
        patch_size: the official's patch size (bookkeeping only; tokens are pixels).
        cpu_cache_length: longer clips on a non-CPU device keep their features and flows on the CPU, in training as
            well (the moves are differentiable); the output comes back on the input's device.
        is_low_res_input: must be true (x4 super-resolution); the official builds no feature extractor otherwise.
        use_checkpoint: activation checkpointing (non-reentrant) of the Swin blocks, per branch (backward_1,
            forward_1, backward_2, forward_2), or one value for all four.
        spynet_path: SpyNet weights (``{'params': ...}``); ``None`` keeps random weights. A missing file is an
            error; nothing is downloaded.
        drop_path_rate: stochastic depth of each transformer (the official hard-codes 0.1).
    """

    def __init__(self, in_channels: int = 3, mid_channels: int = 64, embed_dim: int = 120,
                 depths: Sequence[int] = (6, 6, 6, 6, 6, 6), num_heads: Sequence[int] = (6, 6, 6, 6, 6, 6),
                 window_size: Sequence[int] = (3, 8, 8), num_frames: int = 3, img_size: int = 64,
                 patch_size: int = 1, cpu_cache_length: int = 100, is_low_res_input: bool = True,
                 use_checkpoint: bool | Sequence[bool] = (True, True, True, True),
                 spynet_path: str | os.PathLike | None = None, drop_path_rate: float = 0.1) -> None:
        super().__init__()
        if not is_low_res_input:
            raise ValueError('IART is_low_res_input must be true: the network is x4 super-resolution (the official '
                             'builds no feature extractor for full-resolution input and fails on it)')
        if in_channels != 3:
            raise ValueError(f'IART in_channels must be 3 (its skip adds the upsampled RGB input to an RGB output), '
                             f'got {in_channels}')
        if len(depths) != len(num_heads) or len(window_size) != 3:
            raise ValueError(f'IART needs one num_heads per depth and a 3-value window_size, got depths '
                             f'{list(depths)}, num_heads {list(num_heads)}, window_size {list(window_size)}')
        bad = [heads for heads in num_heads if embed_dim % heads]
        if embed_dim % 4 or bad:
            raise ValueError(f'IART embed_dim {embed_dim} must be divisible by 4 and by every num_heads (not by {bad})')
        if math.ceil(num_frames / window_size[0]) != math.ceil(STACK_FRAMES / window_size[0]):
            raise ValueError(f'IART num_frames {num_frames} with window_size[0] {window_size[0]} gives a shift mask '
                             f'for another number of frame windows than the {STACK_FRAMES} frames each step attends '
                             f'over; use num_frames {STACK_FRAMES}')
        flags = [bool(use_checkpoint)] * 4 if isinstance(use_checkpoint, bool) else [bool(f) for f in use_checkpoint]
        if len(flags) != 4:
            raise ValueError(f'IART use_checkpoint takes one flag per branch ({", ".join(BRANCHES)}) or one for all, '
                             f'got {list(use_checkpoint)}')  # type: ignore[arg-type]
        self.mid_channels, self.embed_dim = mid_channels, embed_dim
        self.is_low_res_input = is_low_res_input
        self.cpu_cache_length = cpu_cache_length
        self.img_size, self.patch_size, self.num_frames = img_size, patch_size, num_frames
        # tests only: cache mode on the CPU, where its moves are no-ops but every other step of the mode runs
        self._force_cpu_cache = False

        self.spynet = SpyNet(spynet_path, return_levels=(5,))
        self.conv_first = nn.Conv2d(in_channels, embed_dim, 3, 1, 1)
        self.swin_backbone = nn.ModuleDict({
            name: PropagationTransformer(in_channels, embed_dim, depths, num_heads, window_size, 2.0,
                                         drop_path_rate, flags[i])
            for i, name in enumerate(BRANCHES)})
        self.conv_before_upsample = nn.Conv2d(embed_dim, mid_channels, 3, 1, 1)
        self.upconv1 = nn.Conv2d(mid_channels, mid_channels * 4, 3, 1, 1)
        self.upconv2 = nn.Conv2d(mid_channels, 64 * 4, 3, 1, 1)
        self.pixel_shuffle = nn.PixelShuffle(2)
        self.conv_hr = nn.Conv2d(64, 64, 3, 1, 1)
        self.conv_last = nn.Conv2d(64, 3, 3, 1, 1)
        self.implicit_warp = ImplicitWarp(embed_dim, num_heads[0], ALIGN_WINDOW, PE_TEMPERATURE)

    @property
    def io(self) -> NetIO:
        """What IART eats and gives: RGB, x4, LQ frames of at least :data:`MIN_LQ_SIZE` pixels. Temporal tiles of 100
        frames with 10 of overlap where a tile is wanted (the official tests whole clips, as ``--task`` does): a
        recurrent network gets better the more frames it sees."""
        return NetIO(in_chans=3, out_chans=3, scale=4, temporal_tile=100, temporal_overlap=10, min_size=MIN_LQ_SIZE)

    @staticmethod
    def is_mirror_extended(lqs: Tensor) -> bool:
        """True when frame i equals frame t-1-i for every i (t even), e.g. Vimeo's 7 -> 14 mirrored clips."""
        t = lqs.shape[1]
        return t % 2 == 0 and torch.equal(lqs[:, : t // 2], lqs[:, t // 2:].flip(1))

    def check_input(self, lqs: Tensor) -> None:
        """Refuse, in one line, an input the network cannot take: (N, T, 3, H, W), T >= 1, H and W >= 64."""
        if lqs.dim() != 5:
            raise ValueError(f'IART expects (N, T, C, H, W) input, got shape {tuple(lqs.shape)}')
        _, t, c, h, w = lqs.shape
        if c != 3:
            raise ValueError(f'IART expects 3 input channels (RGB), got {c}')
        if t < 1:
            raise ValueError('IART needs at least one frame, got 0')
        if min(h, w) < MIN_LQ_SIZE:
            raise ValueError(f'IART needs low-resolution frames of at least {MIN_LQ_SIZE}x{MIN_LQ_SIZE} (the official '
                             f'asserts it), got {h}x{w}: pad the frames to at least {max(h, MIN_LQ_SIZE)}x'
                             f'{max(w, MIN_LQ_SIZE)}, or test with tiles of at least {MIN_LQ_SIZE} (--tile T '
                             f'{MIN_LQ_SIZE} {MIN_LQ_SIZE}, or 0 for whole frames)')

    def check_clip_lengths(self, clips: Sequence[tuple[str, int]], tiling: dict) -> None:
        """Refuse, before any work (``main_test_vrt.py`` calls it), a clip shorter than ``num_frames`` and spatial
        tiles below :data:`MIN_LQ_SIZE`.

        Args:
            clips: ``(name, frames)`` of each clip to restore.
            tiling: the evaluation's tiling (``size_patch_testing``: the tile's height and width, 0 = whole frames).

        Raises:
            ValueError: one line naming the clip or the tile and what IART needs.
        """
        tile = int(tiling.get('size_patch_testing') or 0)
        if 0 < tile < MIN_LQ_SIZE:
            raise ValueError(f'--tile: tiles of {tile}x{tile} LQ pixels, but IART needs at least {MIN_LQ_SIZE}x'
                             f'{MIN_LQ_SIZE} (the official asserts it): give --tile T {MIN_LQ_SIZE} {MIN_LQ_SIZE} or '
                             'more, or 0 for whole frames')
        for name, frames in clips:
            if 0 < frames < self.num_frames:
                raise ValueError(f'clip {name} has {frames} frame(s), fewer than the {self.num_frames} IART attends '
                                 f'over at each step (num_frames): give clips of at least {self.num_frames} frames')

    # ------------------------------------------------------------------------------------------- flows
    def compute_flow(self, lqs: Tensor, mirrored: bool, store: torch.device, chunk: int = 0) -> tuple[Tensor, Tensor]:
        """SpyNet flows between neighbours (:func:`models.network_spynet.neighbour_flows`) with autocast off:
        ``(flows_forward, flows_backward)``, each (N, T-1, 2, H, W), kept on ``store``."""
        with autocast_off(lqs.device):
            return neighbour_flows(self.spynet, lqs, mirrored, store, chunk)

    # ------------------------------------------------------------------------------------------- propagation
    def propagate(self, feats: list[Tensor], flows: Tensor, name: str, device: torch.device) -> list[Tensor]:
        """One propagation branch.

        Args:
            feats: the previous branch's per-frame features (the spatial ones for ``backward_1``), each
                (N, C, H, W), kept where the cache keeps them.
            flows: (N, T-1, 2, H, W) flows of this branch's direction.
            name: one of :data:`BRANCHES`.
            device: where to compute.

        Returns:
            This branch's per-frame features in time order, each (N, C, H, W), kept where ``feats`` are.
        """
        t = len(feats)
        backward = name.startswith('backward')
        store = feats[0].device
        outputs: list[Tensor] = []
        prev = prev_flow = None
        for i, idx in enumerate(range(t - 1, -1, -1) if backward else range(t)):
            current = feats[idx].to(device)
            if prev is None:
                cond = torch.stack([current, current, current], dim=1)
            else:
                flow_n1 = flows[:, idx if backward else idx - 1].to(device)
                cond_n1 = self.implicit_warp(prev, current, flow_n1)
                if i > 1:
                    flow_n2 = flow_n1 + flow_warp(prev_flow, flow_n1.permute(0, 2, 3, 1))
                    cond_n2 = self.implicit_warp(outputs[-2].to(device), current, flow_n2)
                else:
                    cond_n2 = torch.zeros_like(cond_n1)
                prev_flow = flow_n1
                cond = torch.stack([cond_n1, current.permute(0, 2, 3, 1).to(cond_n1.dtype), cond_n2], dim=1)
                cond = cond.permute(0, 1, 4, 2, 3)  # (N, 3, C, H, W), channels-last memory
            prev = self.swin_backbone[name](cond)
            outputs.append(prev if store == device else prev.to(store))
        return outputs[::-1] if backward else outputs

    # ------------------------------------------------------------------------------------------- head
    def _head(self, feats: Tensor, lqs: Tensor) -> Tensor:
        """(M, C, h, w) features and (M, 3, h, w) frames -> (M, 3, 4h, 4w)."""
        # in place, as the official: autograd then keeps one high-resolution tensor per activation, not two (the
        # shuffles' and convolutions' outputs are not saved for their own backward)
        x = self.conv_before_upsample(feats)
        x = F.leaky_relu(self.pixel_shuffle(self.upconv1(x)), 0.1, inplace=True)
        x = F.leaky_relu(self.pixel_shuffle(self.upconv2(x)), 0.1, inplace=True)
        x = self.conv_last(F.leaky_relu(self.conv_hr(x), 0.1, inplace=True))
        return x.add_(F.interpolate(lqs, scale_factor=4, mode='bilinear', align_corners=False).to(x.dtype))

    def forward(self, lqs: Tensor) -> Tensor:
        """Super-resolve a clip.

        Args:
            lqs: (N, T, 3, H, W) RGB in [0, 1], H and W >= 64.

        Returns:
            (N, T, 3, 4H, 4W) on ``lqs``'s device.
        """
        self.check_input(lqs)
        n, t, c, h, w = lqs.shape
        device = lqs.device
        cache = t > self.cpu_cache_length and (device.type != 'cpu' or self._force_cpu_cache)
        store = torch.device('cpu') if cache else device
        frames = max(1, CACHE_CHUNK_PIXELS // (h * w))
        chunks = [(s, min(s + frames, t)) for s in range(0, t, frames)] if cache else [(0, t)]

        feats: list[Tensor] = []
        for s, e in chunks:
            feat = self.conv_first(lqs[:, s:e].reshape(-1, c, h, w))
            feats += [f.to(store) for f in feat.view(n, e - s, *feat.shape[1:]).unbind(1)]
        flows_forward, flows_backward = self.compute_flow(lqs, self.is_mirror_extended(lqs), store,
                                                          chunk=frames if cache else 0)
        for name in BRANCHES:
            feats = self.propagate(feats, flows_backward if name.startswith('backward') else flows_forward, name,
                                   device)

        # a frame at a time, as the official: in training the gradients of one frame's high-resolution layers at a
        # time are the backward's largest transient; in inference one frame's tensors are reused by the allocator
        # where several frames' would be fresh pages each time (3 frames of 64x64 LQ: 128 ms against 195 ms)
        return torch.stack([self._head(f.to(device), lqs[:, i]) for i, f in enumerate(feats)], dim=1)
