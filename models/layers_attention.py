"""3-D (shifted) window attention: the TMSA blocks of VRT, also the Swin blocks of RVRT.

* features are channels-last ``(B, D, H, W, C)``;
* attention runs through ``F.scaled_dot_product_attention`` with the relative-position bias and the shift mask
  folded into one additive mask; the windows, shift masks and their cache are :mod:`models.layers_window`'s;
* the kernel call itself (head-dim padding, chunking below CUDA's grid limit, the trainable-bias backward of the
  CPU) is :func:`models.layers_sdpa.attention`;
* activation checkpointing is non-reentrant.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from timm.layers import DropPath, trunc_normal_
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from models.layers_conv import eager_no_grad, in_graph
from models.layers_linear import Linear
from models.layers_sdpa import attention
from models.layers_window import (
    ShiftMask,
    Size3,
    compute_mask,
    compute_shift_mask,
    get_window_size,
    grouped_window_partition,
    grouped_window_reverse,
    relative_position_index,
    shifted_window_partition,
    shifted_window_reverse,
    sine_position_encoding,
    window_partition,
    window_reverse,
)

# In CPU training a TMSA branch that drop path drops for every sample is not computed (TMSA._residual);
# models.memory_plan turns this off for its pass, so that its estimate counts every branch (the worst case).
SKIP_DROPPED_BRANCHES = True


class MlpGEGLU(nn.Module):
    """Gated MLP: ``fc2(GELU(fc11(x)) * fc12(x))``, channels-last (..., C) -> (..., C_out)."""

    def __init__(self, in_features: int, hidden_features: int | None = None, out_features: int | None = None):
        super().__init__()
        hidden_features = hidden_features or in_features
        self.fc11 = Linear(in_features, hidden_features)
        self.fc12 = Linear(in_features, hidden_features)
        self.act = nn.GELU()
        self.fc2 = Linear(hidden_features, out_features or in_features)

    def forward(self, x: Tensor) -> Tensor:
        """x: (..., C_in) -> (..., C_out)."""
        if eager_no_grad() and type(self.act) is nn.GELU:
            # the same ops in place: two hidden-sized allocations fewer (fresh pages at the released sizes),
            # 1.15-1.35x faster at 6 x 64 x 64 tokens of 120-180 channels, the same bits
            hidden = torch.ops.aten.gelu_(self.fc11(x), approximate=self.act.approximate)
            return self.fc2(hidden.mul_(self.fc12(x)))
        return self.fc2(self.act(self.fc11(x)) * self.fc12(x))


class WindowAttention(nn.Module):
    """Window self-attention with relative position bias, plus optional mutual attention between frame pairs.

    Args:
        dim: channels.
        window_size: (Wd, Wh, Ww); mutual attention needs Wd == 2.
        num_heads: attention heads.
        qkv_bias: bias in the q/k/v projections.
        qk_scale: overrides head_dim ** -0.5.
        mut_attn: add mutual attention (frame 1 <-> frame 2 of each window) with a sine position bias.
        bias_table_std: std of the truncated-normal init of the relative position bias table (0: zeros, RVRT's).
    """

    def __init__(
        self,
        dim: int,
        window_size: Size3,
        num_heads: int,
        qkv_bias: bool = False,
        qk_scale: float | None = None,
        mut_attn: bool = True,
        bias_table_std: float = 0.02,
    ) -> None:
        super().__init__()
        self.window_size = tuple(window_size)
        self.num_heads = num_heads
        self.scale = qk_scale or (dim // num_heads) ** -0.5
        self.mut_attn = mut_attn
        table_size = (2 * window_size[0] - 1) * (2 * window_size[1] - 1) * (2 * window_size[2] - 1)
        self.relative_position_bias_table = nn.Parameter(torch.zeros(table_size, num_heads))
        self.register_buffer('relative_position_index', relative_position_index(self.window_size))
        self.qkv_self = Linear(dim, dim * 3, bias=qkv_bias)
        if mut_attn:
            self.register_buffer('position_bias', sine_position_encoding(self.window_size[1:], dim // 2))
            self.qkv_mut = Linear(dim, dim * 3, bias=qkv_bias)
        self.proj = Linear(2 * dim if mut_attn else dim, dim)
        if bias_table_std > 0:
            trunc_normal_(self.relative_position_bias_table, std=bias_table_std)

    def _attend(self, q: Tensor, k: Tensor, v: Tensor, bias: Tensor | None, num_windows: int) -> Tensor:
        """Attention over windows.

        q, k, v: (B * nW, ..., h, n, hd); bias: (nW or 1, ..., h or 1, n, n) additive, or None.
        The window axis is folded into the head axis, so the problem is 4-D with a mask broadcast over the batch:
        ``F.scaled_dot_product_attention`` then takes its fused kernels (flash on CPU, memory-efficient on CUDA).
        See :func:`attention` for the head-dim padding and the chunking of the folded axis.
        """
        shape = q.shape
        n = shape[-2]
        if bias is None:
            fold = (shape[0], -1, n, shape[-1])
            mask = None
        else:
            fold = (shape[0] // num_windows, -1, n, shape[-1])
            mask = bias.expand(num_windows, *shape[1:-1], n).reshape(1, -1, n, n).to(q.dtype)
        out = attention(q.reshape(fold), k.reshape(fold), v.reshape(fold), mask, self.scale)
        return out.reshape(shape)

    def _attend_in_graph(self, q: Tensor, k: Tensor, v: Tensor, rel_bias: Tensor | None,
                         window_mask: Tensor | None, num_windows: int) -> Tensor:
        """Attention as an ONNX export traces it (``torch.onnx.is_in_onnx_export()``; eager runs :meth:`_attend`).

        q, k, v: (B * nW, ..., h, n, hd); rel_bias: (1, h, n, n) or None; window_mask: (nW, 1, ..., n, n) or None.
        The relative-position bias and the shift mask are added to the scores one after the other. Their sum
        expanded over windows and heads (what :meth:`_attend` hands the fused kernel) depends on nothing but
        weights and constants, so the exporter's constant folding would store it per block: nW x h x n x n floats,
        which grows with the tile (about 0.3 GB per shifted block of VRT 001 at 64 x 64, four times that at
        128 x 128). Added separately, the graph keeps one bias per block and one mask per size (deduplicated).
        Same result as :meth:`_attend` up to rounding (the fused kernel's summation order).
        """
        scores = torch.matmul(q * self.scale, k.transpose(-2, -1))
        if rel_bias is not None:
            scores = scores + rel_bias
        if window_mask is not None:
            shape = scores.shape
            scores = (scores.view(-1, num_windows, *shape[1:]) + window_mask).view(shape)
        return torch.matmul(scores.softmax(dim=-1), v)

    def _attend_grouped(self, q: Tensor, k: Tensor, v: Tensor, bias: Tensor | None, mask: ShiftMask,
                        n: int) -> Tensor:
        """:meth:`_attend` with a :class:`ShiftMask`: the windows whose mask is all zeros attend with ``bias`` alone,
        broadcast over them; the windows of each distinct mask with ``bias`` plus that mask, broadcast likewise.
        q, k, v: (B * nW, ..., h, n, hd), windows in the mask's groups (``mask.grouped``: sample-major within a
        group); bias: (1, h, n, n) or None. Returns (B * nW, ..., h, n, hd), windows in the order they came."""
        num_windows = mask.num_windows
        rest = q.shape[1:]
        b = q.shape[0] // num_windows
        groups = mask.groups()

        def attend(q_g: Tensor, k_g: Tensor, v_g: Tensor, window_mask: Tensor | None) -> Tensor:
            # one mask for the whole group, broadcast over its windows like the bias (no windows x heads x N x N sum)
            if window_mask is None:
                return self._attend(q_g, k_g, v_g, bias, 1)
            window_mask = window_mask[:n, :n].view(*[1] * (len(rest) - 1), n, n)
            return self._attend(q_g, k_g, v_g, window_mask if bias is None else bias + window_mask, 1)

        # the groups are slices: views forward, one concatenation backward (no gather, no scatter)
        sizes = [b * index.numel() for index, _ in groups]
        parts = [attend(q_g, k_g, v_g, window_mask)
                 for q_g, k_g, v_g, (index, window_mask) in zip(*(t.split(sizes) for t in (q, k, v)), groups)
                 if index.numel()]
        return torch.cat(parts) if len(parts) > 1 else parts[0]

    def forward(self, x: Tensor, mask: Tensor | ShiftMask | None = None) -> Tensor:
        """Attention inside each window.

        Args:
            x: (B * nW, N, C) window tokens.
            mask: the shift mask: dense (nW, N_full, N_full) 0 / -100 (:func:`compute_mask`), or compact
                (:func:`compute_shift_mask`, same result, far less memory; the windows in its groups where
                ``mask.grouped``, see :func:`grouped_window_partition`); None for unshifted windows.

        Returns:
            (B * nW, N, C).
        """
        b_, n, c = x.shape
        h = self.num_heads
        # unbind, not qkv[i]: its backward stacks the three gradients in one pass (each select's backward
        # zero-fills a tensor of all three and adds them)
        q, k, v = self.qkv_self(x).view(b_, n, 3, h, c // h).permute(2, 0, 3, 1, 4).unbind(0)  # (B_, h, N, hd)
        # index_select, not table[index]: the backward of advanced indexing accumulates with atomic adds on the CPU
        # (a different sum order at each run with several threads); index_select's backward sums in a fixed order
        index = self.relative_position_index[:n, :n].reshape(-1)
        rel_bias = self.relative_position_bias_table.index_select(0, index)
        # contiguous (h, N, N): added to a mask or handed to the kernel without a strided copy of nW x h x N x N
        bias = rel_bias.view(n, n, h).permute(2, 0, 1).contiguous().unsqueeze(0)  # (1, h, N, N)
        num_windows = 1
        in_graph = torch.onnx.is_in_onnx_export()  # False under torch.compile (dynamo folds it)
        if isinstance(mask, ShiftMask) and (in_graph or not mask.grouped):  # windows in window_partition order
            mask = mask.dense()
        grouped = isinstance(mask, ShiftMask)
        if in_graph:
            window_mask = None if mask is None else mask[:, None, :n, :n]
            num_windows = num_windows if mask is None else mask.shape[0]
            out = self._attend_in_graph(q, k, v, bias, window_mask, num_windows)
        elif grouped:
            out = self._attend_grouped(q, k, v, bias, mask, n)
        else:
            if mask is not None:
                num_windows = mask.shape[0]
                bias = bias + mask[:, None, :n, :n]
            out = self._attend(q, k, v, bias, num_windows)  # (B_, h, N, hd)
        if self.mut_attn:
            half = n // 2
            xm = x + self.position_bias.repeat(1, 2, 1)
            q, k, v = self.qkv_mut(xm).view(b_, 2, half, 3, h, c // h).permute(3, 0, 1, 4, 2, 5).unbind(0)
            q = q.flip(1)  # (B_, 2, h, n/2, hd) each: frame 2 queries frame 1, frame 1 queries frame 2
            if grouped:
                mut = self._attend_grouped(q, k, v, None, mask, half)
            else:
                mut_mask = None if mask is None else mask[:, None, None, :half, :half]
                if in_graph:
                    mut = self._attend_in_graph(q, k, v, None, mut_mask, num_windows)
                else:
                    mut = self._attend(q, k, v, mut_mask, num_windows)  # (B_, 2, h, n/2, hd)
            # (B_, N, 2C) channels [mutual, self] in one copy (a cat of the two reshaped outputs copies three times)
            out = torch.stack([mut.permute(0, 1, 3, 2, 4), out.transpose(1, 2).view(b_, 2, half, h, c // h)], dim=3)
            return self.proj(out.view(b_, n, 2 * c))
        return self.proj(out.transpose(1, 2).reshape(b_, n, c))


class TMSA(nn.Module):
    """Temporal mutual self-attention block (pre-norm attention + GEGLU MLP), channels-last.

    Args:
        dim: channels.
        num_heads: attention heads.
        window_size: (Wd, Wh, Ww).
        shift_size: cyclic shift per axis, each below the window.
        mut_attn: use mutual + self attention.
        mlp_ratio: hidden / dim in the MLP.
        qkv_bias, qk_scale: see :class:`WindowAttention`.
        drop_path: stochastic depth rate.
        norm_layer: normalisation class.
        use_checkpoint_attn, use_checkpoint_ffn: activation checkpointing (non-reentrant) of each half.
        mlp_layer: ``mlp_layer(dim, hidden)`` builds the MLP (VRT: GEGLU; RVRT: timm's GELU ``Mlp``).
        bias_table_std: see :class:`WindowAttention`.
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        window_size: Size3 = (6, 8, 8),
        shift_size: Size3 = (0, 0, 0),
        mut_attn: bool = True,
        mlp_ratio: float = 2.0,
        qkv_bias: bool = True,
        qk_scale: float | None = None,
        drop_path: float = 0.0,
        norm_layer: type[nn.Module] = nn.LayerNorm,
        use_checkpoint_attn: bool = False,
        use_checkpoint_ffn: bool = False,
        mlp_layer: Callable[[int, int], nn.Module] = MlpGEGLU,
        bias_table_std: float = 0.02,
    ) -> None:
        super().__init__()
        self.window_size = tuple(window_size)
        self.shift_size = tuple(shift_size)
        if not all(0 <= s < w for s, w in zip(self.shift_size, self.window_size)):
            raise ValueError(f'shift_size {shift_size} must lie in [0, window_size {window_size})')
        self.use_checkpoint_attn = use_checkpoint_attn
        self.use_checkpoint_ffn = use_checkpoint_ffn
        self.norm1 = norm_layer(dim)
        self.attn = WindowAttention(dim, self.window_size, num_heads, qkv_bias, qk_scale, mut_attn, bias_table_std)
        self.drop_path = DropPath(drop_path) if drop_path > 0.0 else nn.Identity()
        self.norm2 = norm_layer(dim)
        self.mlp = mlp_layer(dim, int(dim * mlp_ratio))

    def _attn_part(self, x: Tensor, mask: Tensor | ShiftMask | None) -> Tensor:
        b, d, h, w, _ = x.shape
        window, shift = get_window_size((d, h, w), self.window_size, self.shift_size)
        x = self.norm1(x)
        pad_d, pad_h, pad_w = ((ws - n % ws) % ws for n, ws in zip((d, h, w), window))
        if pad_d or pad_h or pad_w:
            x = F.pad(x, (0, 0, 0, pad_w, 0, pad_h, 0, pad_d))
        dp, hp, wp = d + pad_d, h + pad_h, w + pad_w
        shifted = any(s > 0 for s in shift)
        in_graph = torch.onnx.is_in_onnx_export()
        if shifted and not in_graph and isinstance(mask, ShiftMask):
            # the same values, one gather each way, with the windows in the mask's groups (then slices)
            windows = self.attn(grouped_window_partition(x, window, shift), mask=mask.in_groups())
            x = grouped_window_reverse(windows, window, shift, b, dp, hp, wp)
        elif shifted and not in_graph:
            windows = self.attn(shifted_window_partition(x, window, shift), mask=mask)
            x = shifted_window_reverse(windows, window, shift, b, dp, hp, wp)
        elif shifted:
            x = torch.roll(x, shifts=tuple(-s for s in shift), dims=(1, 2, 3))
            windows = self.attn(window_partition(x, window), mask=mask)
            x = torch.roll(window_reverse(windows, window, b, dp, hp, wp), shifts=shift, dims=(1, 2, 3))
        else:
            x = window_reverse(self.attn(window_partition(x, window)), window, b, dp, hp, wp)
        if pad_d or pad_h or pad_w:
            x = x[:, :d, :h, :w, :]
        return x

    def _ffn_part(self, x: Tensor) -> Tensor:
        return self.mlp(self.norm2(x))

    def _residual(self, part: Callable[..., Tensor], modules: tuple[nn.Module, ...], ckpt: bool, x: Tensor,
                  *args: Any) -> Tensor:
        """``x + drop_path(part(x, *args))``, ``part`` checkpointed with ``ckpt``.

        In training on the CPU the drop-path draw comes first, and a branch dropped for every sample is not computed:
        timm's ``drop_path`` would multiply it by 0, so the sum is ``x`` either way; its parameters (``modules``')
        get the zero gradients they would get (so Adam and DDP see them as before). The draw is the same
        ``bernoulli_`` on the same generator at the same place in the stream (the branch draws no random numbers),
        kept branches are scaled as timm scales them, so outputs and gradients are the same bits (but where a dropped
        branch's output is not finite: timm's product is NaN there). At batch 1 (one clip a process, as VRT's recipes
        train) a branch is skipped with its rate (VRT: 0-0.2 by block, 0.1 on average), with its activations; tiny VRT
        train step 1.12x (benchmarks/RESULTS.md, "VRT speed by profiling, session 8"). Elsewhere (another device:
        the check would synchronise; a graph being recorded) timm's ``DropPath`` runs.
        """
        def branch() -> Tensor:
            return checkpoint(part, x, *args, use_reentrant=False) if ckpt else part(x, *args)

        drop = self.drop_path
        if not (SKIP_DROPPED_BRANCHES and isinstance(drop, DropPath) and drop.training and drop.drop_prob > 0
                and x.device.type == 'cpu' and not in_graph()):
            return x + drop(branch())
        keep_prob = 1 - drop.drop_prob
        keep = x.new_empty((x.shape[0],) + (1,) * (x.ndim - 1)).bernoulli_(keep_prob)  # timm's draw, 0 or 1
        if not keep.any():
            params = [p for m in modules for p in m.parameters() if p.requires_grad]
            if not params or not torch.is_grad_enabled():
                return x
            return x + torch.stack([p.sum() for p in params]).sum() * 0  # zero gradients for the parameters
        y = branch()
        keep = keep.to(y.dtype)
        if keep_prob > 0.0 and drop.scale_by_keep:
            keep.div_(keep_prob)
        return x + y * keep

    def forward(self, x: Tensor, mask: Tensor | ShiftMask | None) -> Tensor:
        """x: (B, D, H, W, C); mask: cached shift mask for the padded size (dense or :class:`ShiftMask`).
        Returns (B, D, H, W, C)."""
        grad = torch.is_grad_enabled()
        x = self._residual(self._attn_part, (self.norm1, self.attn), self.use_checkpoint_attn and grad, x, mask)
        return self._residual(self._ffn_part, (self.norm2, self.mlp), self.use_checkpoint_ffn and grad, x)


class TMSAG(nn.Module):
    """A group of TMSA blocks alternating unshifted and shifted (half-window) windows.

    Args:
        dim, depth, num_heads: channels, blocks, heads.
        window_size: (Wd, Wh, Ww).
        mut_attn: mutual attention in every block.
        drop_path: one rate per block (or one for all).
        Other arguments: see :class:`TMSA`.
    """

    def __init__(
        self,
        dim: int,
        depth: int,
        num_heads: int,
        window_size: Size3,
        mut_attn: bool = True,
        mlp_ratio: float = 2.0,
        qkv_bias: bool = False,
        qk_scale: float | None = None,
        drop_path: float | Sequence[float] = 0.0,
        norm_layer: type[nn.Module] = nn.LayerNorm,
        use_checkpoint_attn: bool = False,
        use_checkpoint_ffn: bool = False,
        mlp_layer: Callable[[int, int], nn.Module] = MlpGEGLU,
        bias_table_std: float = 0.02,
    ) -> None:
        super().__init__()
        self.window_size = tuple(window_size)
        self.shift_size = tuple(w // 2 for w in self.window_size)
        rates = list(drop_path) if isinstance(drop_path, Sequence) else [drop_path] * depth
        self.blocks = nn.ModuleList([
            TMSA(
                dim, num_heads, self.window_size, (0, 0, 0) if i % 2 == 0 else self.shift_size, mut_attn,
                mlp_ratio, qkv_bias, qk_scale, rates[i], norm_layer, use_checkpoint_attn, use_checkpoint_ffn,
                mlp_layer, bias_table_std,
            )
            for i in range(depth)
        ])

    def forward(self, x: Tensor) -> Tensor:
        """x: (B, D, H, W, C) -> (B, D, H, W, C)."""
        _, d, h, w, _ = x.shape
        window, shift = get_window_size((d, h, w), self.window_size, self.shift_size)
        padded = tuple(math.ceil(n / ws) * ws for n, ws in zip((d, h, w), window))
        # an ONNX graph takes the dense mask (a constant of the graph); building the compact one is not traceable
        make_mask = compute_mask if torch.onnx.is_in_onnx_export() else compute_shift_mask
        mask = make_mask(*padded, window, shift, x.device) if len(self.blocks) > 1 else None
        for blk in self.blocks:
            x = blk(x, mask)
        return x


class RTMSA(nn.Module):
    """Residual TMSA group (stage 8): ``x + linear(TMSAG(x))`` with self-attention only, channels-last.

    Args:
        dim, depth, num_heads, window_size, mlp_ratio: see :class:`TMSAG`.
        qkv_bias: bias in the qkv projection (on by default here, unlike :class:`TMSAG`).
        **kwargs: ``qk_scale``, ``drop_path``, ``norm_layer``, ``use_checkpoint_attn``, ``use_checkpoint_ffn``,
            ``mlp_layer``, ``bias_table_std``.
    """

    def __init__(self, dim: int, depth: int, num_heads: int, window_size: Size3, mlp_ratio: float = 2.0,
                 qkv_bias: bool = True, **kwargs: Any) -> None:
        super().__init__()
        self.residual_group = TMSAG(dim, depth, num_heads, window_size, mut_attn=False, mlp_ratio=mlp_ratio,
                                    qkv_bias=qkv_bias, **kwargs)
        self.linear = Linear(dim, dim)

    def forward(self, x: Tensor) -> Tensor:
        """x: (B, D, H, W, C) -> (B, D, H, W, C)."""
        return x + self.linear(self.residual_group(x))
