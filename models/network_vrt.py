"""VRT: a Video Restoration Transformer (Liang et al., 2022), state-dict compatible with the released models.

Module and parameter names, shapes and persistent buffers follow the reference implementation, so the
official ``{'params': ...}`` checkpoints (tasks 001-009) load with ``strict=True`` and give the same fp32
outputs. The computation is reorganised for speed without changing the numerics:

* features stay channels-last ``(B, D, H, W, C)`` between the attention groups (fewer transposes);
* window attention runs through ``F.scaled_dot_product_attention`` with the relative-position bias and the
  shift mask folded into one additive mask; shift masks are cached per size;
* optical flow, flow composition, warping, the deformable alignment and the (1, 3, 3) convolutions run on
  all frames at once instead of in Python loops over frames;
* activation checkpointing is non-reentrant and follows the ``use_checkpoint_*`` / ``no_checkpoint_*`` flags
  everywhere (the reference always checkpoints the attention of ``residual_group2``);
* the deformable convolution and all grid sampling run in fp32 under autocast.
"""

from __future__ import annotations

import functools
import logging
import math
import os
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
import torchvision
from einops.layers.torch import Rearrange
from timm.layers import DropPath, trunc_normal_
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from models.network_spynet import SpyNet, flow_warp

logger = logging.getLogger(__name__)

Size3 = tuple[int, int, int]


# ----------------------------------------------------------------------------------------------------------
# window helpers
# ----------------------------------------------------------------------------------------------------------
def window_partition(x: Tensor, window_size: Size3) -> Tensor:
    """Split into non-overlapping windows.

    Args:
        x: (B, D, H, W, C), each of D, H, W divisible by the window.
        window_size: (Wd, Wh, Ww).

    Returns:
        (B * num_windows, Wd * Wh * Ww, C), windows ordered d-major, then h, then w.
    """
    b, d, h, w, c = x.shape
    wd, wh, ww = window_size
    x = x.view(b, d // wd, wd, h // wh, wh, w // ww, ww, c)
    return x.permute(0, 1, 3, 5, 2, 4, 6, 7).reshape(-1, wd * wh * ww, c)


def window_reverse(windows: Tensor, window_size: Size3, b: int, d: int, h: int, w: int) -> Tensor:
    """Inverse of :func:`window_partition`: (B * num_windows, Wd * Wh * Ww, C) -> (B, D, H, W, C)."""
    wd, wh, ww = window_size
    x = windows.view(b, d // wd, h // wh, w // ww, wd, wh, ww, -1)
    return x.permute(0, 1, 4, 2, 5, 3, 6, 7).reshape(b, d, h, w, -1)


def get_window_size(x_size: Size3, window_size: Size3, shift_size: Size3) -> tuple[Size3, Size3]:
    """Shrink the window (and zero the shift) along axes where the input is not larger than the window."""
    use_window = list(window_size)
    use_shift = list(shift_size)
    for i, n in enumerate(x_size):
        if n <= window_size[i]:
            use_window[i] = n
            use_shift[i] = 0
    return tuple(use_window), tuple(use_shift)  # type: ignore[return-value]


@functools.lru_cache(maxsize=64)
def compute_mask(d: int, h: int, w: int, window_size: Size3, shift_size: Size3, device: torch.device) -> Tensor:
    """Additive attention mask for shifted windows (0 inside a region, -100 across regions), cached per size.

    Args:
        d, h, w: padded input size, multiples of the window.

    Returns:
        (num_windows, N, N) with N = Wd * Wh * Ww.
    """
    img_mask = torch.zeros((1, d, h, w, 1), device=device)
    cnt = 0
    slices = [
        (slice(-ws), slice(-ws, -ss), slice(-ss, None)) for ws, ss in zip(window_size, shift_size)
    ]
    for sd in slices[0]:
        for sh in slices[1]:
            for sw in slices[2]:
                img_mask[:, sd, sh, sw, :] = cnt
                cnt += 1
    mask_windows = window_partition(img_mask, window_size).squeeze(-1)  # (nW, N)
    attn_mask = mask_windows.unsqueeze(1) - mask_windows.unsqueeze(2)
    return attn_mask.masked_fill(attn_mask != 0, -100.0).masked_fill(attn_mask == 0, 0.0)


def relative_position_index(window_size: Size3) -> Tensor:
    """Pair-wise relative position index into the (2Wd-1)(2Wh-1)(2Ww-1) bias table: (N, N) int64."""
    coords = torch.stack(torch.meshgrid(*[torch.arange(n) for n in window_size], indexing='ij')).flatten(1)
    rel = (coords[:, :, None] - coords[:, None, :]).permute(1, 2, 0)  # (N, N, 3)
    rel = rel + torch.tensor([n - 1 for n in window_size])
    strides = torch.tensor([(2 * window_size[1] - 1) * (2 * window_size[2] - 1), 2 * window_size[2] - 1, 1])
    return (rel * strides).sum(-1)


def sine_position_encoding(hw: tuple[int, int], num_pos_feats: int, temperature: float = 10000.0) -> Tensor:
    """Normalised 2-D sine position encoding (DETR style) over an (H, W) grid.

    Returns:
        (1, H * W, 2 * num_pos_feats): y features then x features, each interleaving sin/cos.
    """
    scale, eps = 2 * math.pi, 1e-6
    ones = torch.ones(1, hw[0], hw[1])
    y_embed = ones.cumsum(1, dtype=torch.float32)
    x_embed = ones.cumsum(2, dtype=torch.float32)
    y_embed = y_embed / (y_embed[:, -1:, :] + eps) * scale
    x_embed = x_embed / (x_embed[:, :, -1:] + eps) * scale
    dim_t = torch.arange(num_pos_feats, dtype=torch.float32)
    dim_t = temperature ** (2 * (dim_t // 2) / num_pos_feats)
    pos_x = x_embed[:, :, :, None] / dim_t
    pos_y = y_embed[:, :, :, None] / dim_t
    pos_x = torch.stack((pos_x[:, :, :, 0::2].sin(), pos_x[:, :, :, 1::2].cos()), dim=4).flatten(3)
    pos_y = torch.stack((pos_y[:, :, :, 0::2].sin(), pos_y[:, :, :, 1::2].cos()), dim=4).flatten(3)
    return torch.cat((pos_y, pos_x), dim=3).flatten(1, 2).contiguous()


# ----------------------------------------------------------------------------------------------------------
# building blocks
# ----------------------------------------------------------------------------------------------------------
class FrameConv(nn.Conv3d):
    """A Conv3d with kernel (1, 3, 3) (reference parameter shape) run as a 2-D convolution on all frames.

    Input and output are frame-batched: (B * D, C, H, W).
    """

    def __init__(self, in_channels: int, out_channels: int) -> None:
        super().__init__(in_channels, out_channels, kernel_size=(1, 3, 3), padding=(0, 1, 1))

    def forward(self, x: Tensor) -> Tensor:
        """x: (B * D, C_in, H, W) -> (B * D, C_out, H, W)."""
        return F.conv2d(x, self.weight.squeeze(2), self.bias, padding=1)


class Upsample(nn.Module):
    """Sub-pixel upsampler on frame-batched features, ``scale`` in {2^n, 3}.

    Convolutions are registered under the indices of the reference's ``nn.Sequential`` (0, 5, 10, ... with
    the final 64 -> 64 convolution last), so checkpoints load unchanged.

    Args:
        scale: upscaling factor.
        num_feat: channels in and out.
    """

    def __init__(self, scale: int, num_feat: int) -> None:
        super().__init__()
        if scale & (scale - 1) == 0:
            steps = [2] * int(math.log2(scale))
        elif scale == 3:
            steps = [3]
        else:
            raise ValueError(f'Upsample scale {scale} is not supported; use a power of 2 or 3')
        self.factors = tuple(steps)
        for i, f in enumerate(steps):
            self.add_module(str(5 * i), FrameConv(num_feat, f * f * num_feat))
        self.add_module(str(5 * len(steps)), FrameConv(num_feat, num_feat))

    def forward(self, x: Tensor) -> Tensor:
        """x: (B * D, C, H, W) -> (B * D, C, sH, sW)."""
        for i, f in enumerate(self.factors):
            x = F.leaky_relu(F.pixel_shuffle(self.get_submodule(str(5 * i))(x), f), 0.1)
        return self.get_submodule(str(5 * len(self.factors)))(x)


class MlpGEGLU(nn.Module):
    """Gated MLP: ``fc2(GELU(fc11(x)) * fc12(x))``, channels-last (..., C) -> (..., C_out)."""

    def __init__(self, in_features: int, hidden_features: int | None = None, out_features: int | None = None):
        super().__init__()
        hidden_features = hidden_features or in_features
        self.fc11 = nn.Linear(in_features, hidden_features)
        self.fc12 = nn.Linear(in_features, hidden_features)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden_features, out_features or in_features)

    def forward(self, x: Tensor) -> Tensor:
        """x: (..., C_in) -> (..., C_out)."""
        return self.fc2(self.act(self.fc11(x)) * self.fc12(x))


class _BiasedAttention(torch.autograd.Function):
    """Attention with a trainable additive bias that stores no (N x N) matrix for backward.

    Forward is ``F.scaled_dot_product_attention`` (the fused kernel); backward recomputes the probabilities per
    sample and chunk of the head axis (FlashAttention's recipe, with the row term ``rowsum(dO * O)``) and returns
    the gradients of q, k, v and the bias. Shapes: q, k, v (B, H, N, d); bias (1, H, N, N), broadcast over B.
    """

    _CHUNK_ELEMENTS = 1 << 21  # about 8 MB of fp32 scores per chunk

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, bias: Tensor, scale: float) -> Tensor:
        # detached, so the kernel choice does not see requires_grad (which would force the math fallback)
        out = F.scaled_dot_product_attention(q.detach(), k.detach(), v.detach(), attn_mask=bias.detach(), scale=scale)
        ctx.save_for_backward(q, k, v, bias, out)
        ctx.scale = scale
        return out

    @staticmethod
    def backward(ctx, grad_out: Tensor):
        q, k, v, bias, out = ctx.saved_tensors
        scale = ctx.scale
        b, heads, n, _ = q.shape
        grad_out = grad_out.contiguous()
        row = (grad_out * out).sum(dim=-1, keepdim=True)  # (B, H, N, 1) = rowsum(dP * P)
        grad_q, grad_k, grad_v = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        grad_bias = torch.zeros_like(bias)
        step = max(1, _BiasedAttention._CHUNK_ELEMENTS // (n * n))
        for i in range(b):
            for h0 in range(0, heads, step):
                hs = slice(h0, min(h0 + step, heads))
                qh, kh, vh, go = q[i, hs], k[i, hs], v[i, hs], grad_out[i, hs]
                probs = torch.baddbmm(bias[0, hs], qh, kh.transpose(-2, -1), alpha=scale).softmax(dim=-1)
                torch.bmm(probs.transpose(-2, -1), go, out=grad_v[i, hs])
                grad_s = torch.bmm(go, vh.transpose(-2, -1)).sub_(row[i, hs]).mul_(probs)  # dL/dscores
                grad_bias[0, hs] += grad_s
                torch.bmm(grad_s, kh, out=grad_q[i, hs]).mul_(scale)
                torch.bmm(grad_s.transpose(-2, -1), qh, out=grad_k[i, hs]).mul_(scale)
        return grad_q, grad_k, grad_v, grad_bias, None


class WindowAttention(nn.Module):
    """Window self-attention with relative position bias, plus optional mutual attention between frame pairs.

    Args:
        dim: channels.
        window_size: (Wd, Wh, Ww); mutual attention needs Wd == 2.
        num_heads: attention heads.
        qkv_bias: bias in the q/k/v projections.
        qk_scale: overrides head_dim ** -0.5.
        mut_attn: add mutual attention (frame 1 <-> frame 2 of each window) with a sine position bias.
    """

    def __init__(
        self,
        dim: int,
        window_size: Size3,
        num_heads: int,
        qkv_bias: bool = False,
        qk_scale: float | None = None,
        mut_attn: bool = True,
    ) -> None:
        super().__init__()
        self.window_size = tuple(window_size)
        self.num_heads = num_heads
        self.scale = qk_scale or (dim // num_heads) ** -0.5
        self.mut_attn = mut_attn
        table_size = (2 * window_size[0] - 1) * (2 * window_size[1] - 1) * (2 * window_size[2] - 1)
        self.relative_position_bias_table = nn.Parameter(torch.zeros(table_size, num_heads))
        self.register_buffer('relative_position_index', relative_position_index(self.window_size))
        self.qkv_self = nn.Linear(dim, dim * 3, bias=qkv_bias)
        if mut_attn:
            self.register_buffer('position_bias', sine_position_encoding(self.window_size[1:], dim // 2))
            self.qkv_mut = nn.Linear(dim, dim * 3, bias=qkv_bias)
        self.proj = nn.Linear(2 * dim if mut_attn else dim, dim)
        trunc_normal_(self.relative_position_bias_table, std=0.02)

    def _attend(self, q: Tensor, k: Tensor, v: Tensor, bias: Tensor | None, num_windows: int) -> Tensor:
        """Attention over windows.

        q, k, v: (B * nW, ..., h, n, hd); bias: (nW or 1, ..., h or 1, n, n) additive, or None.
        The window axis is folded into the head axis, so the problem is 4-D with a mask broadcast over the batch:
        ``F.scaled_dot_product_attention`` then takes its fused kernels (flash on CPU, memory-efficient on CUDA).
        The CPU flash kernel cannot give the gradient of a trainable mask (the relative position bias) and its
        math fallback stores the (B, heads, N, N) probabilities; :class:`_BiasedAttention` covers that case.
        """
        shape = q.shape
        n = shape[-2]
        if bias is None:
            fold = (shape[0], -1, n, shape[-1])
            mask = None
        else:
            fold = (shape[0] // num_windows, -1, n, shape[-1])
            mask = bias.expand(num_windows, *shape[1:-1], n).reshape(1, -1, n, n).to(q.dtype)
        q, k, v = q.reshape(fold), k.reshape(fold), v.reshape(fold)
        if mask is not None and mask.requires_grad and q.device.type == 'cpu' and torch.is_grad_enabled():
            out = _BiasedAttention.apply(q, k, v, mask, self.scale)
        else:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.scale)
        return out.view(shape)

    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        """Attention inside each window.

        Args:
            x: (B * nW, N, C) window tokens.
            mask: (nW, N_full, N_full) shift mask (0 / -100), or None.

        Returns:
            (B * nW, N, C).
        """
        b_, n, c = x.shape
        h = self.num_heads
        qkv = self.qkv_self(x).view(b_, n, 3, h, c // h).permute(2, 0, 3, 1, 4)  # (3, B_, h, N, hd)
        rel_bias = self.relative_position_bias_table[self.relative_position_index[:n, :n].reshape(-1)]
        bias = rel_bias.view(n, n, h).permute(2, 0, 1).unsqueeze(0)  # (1, h, N, N)
        num_windows = 1
        if mask is not None:
            num_windows = mask.shape[0]
            bias = bias + mask[:, None, :n, :n]
        out = self._attend(qkv[0], qkv[1], qkv[2], bias, num_windows)  # (B_, h, N, hd)
        out = out.transpose(1, 2).reshape(b_, n, c)

        if self.mut_attn:
            half = n // 2
            xm = x + self.position_bias.repeat(1, 2, 1)
            qkv = self.qkv_mut(xm).view(b_, 2, half, 3, h, c // h).permute(3, 0, 1, 4, 2, 5)  # (3, B_, 2, h, n/2, hd)
            q, k, v = qkv[0].flip(1), qkv[1], qkv[2]  # frame 2 queries frame 1, frame 1 queries frame 2
            mut_mask = None if mask is None else mask[:, None, None, :half, :half]
            mut = self._attend(q, k, v, mut_mask, num_windows)  # (B_, 2, h, n/2, hd)
            mut = mut.permute(0, 1, 3, 2, 4).reshape(b_, n, c)
            out = torch.cat([mut, out], dim=2)
        return self.proj(out)


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
    ) -> None:
        super().__init__()
        self.window_size = tuple(window_size)
        self.shift_size = tuple(shift_size)
        if not all(0 <= s < w for s, w in zip(self.shift_size, self.window_size)):
            raise ValueError(f'shift_size {shift_size} must lie in [0, window_size {window_size})')
        self.use_checkpoint_attn = use_checkpoint_attn
        self.use_checkpoint_ffn = use_checkpoint_ffn
        self.norm1 = norm_layer(dim)
        self.attn = WindowAttention(dim, self.window_size, num_heads, qkv_bias, qk_scale, mut_attn)
        self.drop_path = DropPath(drop_path) if drop_path > 0.0 else nn.Identity()
        self.norm2 = norm_layer(dim)
        self.mlp = MlpGEGLU(dim, int(dim * mlp_ratio))

    def _attn_part(self, x: Tensor, mask: Tensor | None) -> Tensor:
        b, d, h, w, _ = x.shape
        window, shift = get_window_size((d, h, w), self.window_size, self.shift_size)
        x = self.norm1(x)
        pad_d, pad_h, pad_w = ((ws - n % ws) % ws for n, ws in zip((d, h, w), window))
        if pad_d or pad_h or pad_w:
            x = F.pad(x, (0, 0, 0, pad_w, 0, pad_h, 0, pad_d))
        dp, hp, wp = d + pad_d, h + pad_h, w + pad_w
        shifted = any(s > 0 for s in shift)
        if shifted:
            x = torch.roll(x, shifts=tuple(-s for s in shift), dims=(1, 2, 3))
        windows = self.attn(window_partition(x, window), mask=mask if shifted else None)
        x = window_reverse(windows, window, b, dp, hp, wp)
        if shifted:
            x = torch.roll(x, shifts=shift, dims=(1, 2, 3))
        if pad_d or pad_h or pad_w:
            x = x[:, :d, :h, :w, :]
        return self.drop_path(x)

    def _ffn_part(self, x: Tensor) -> Tensor:
        return self.drop_path(self.mlp(self.norm2(x)))

    def forward(self, x: Tensor, mask: Tensor | None) -> Tensor:
        """x: (B, D, H, W, C); mask: cached shift mask for the padded size. Returns (B, D, H, W, C)."""
        grad = torch.is_grad_enabled()
        if self.use_checkpoint_attn and grad:
            x = x + checkpoint(self._attn_part, x, mask, use_reentrant=False)
        else:
            x = x + self._attn_part(x, mask)
        if self.use_checkpoint_ffn and grad:
            x = x + checkpoint(self._ffn_part, x, use_reentrant=False)
        else:
            x = x + self._ffn_part(x)
        return x


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
    ) -> None:
        super().__init__()
        self.window_size = tuple(window_size)
        self.shift_size = tuple(w // 2 for w in self.window_size)
        rates = list(drop_path) if isinstance(drop_path, Sequence) else [drop_path] * depth
        self.blocks = nn.ModuleList([
            TMSA(
                dim, num_heads, self.window_size, (0, 0, 0) if i % 2 == 0 else self.shift_size, mut_attn,
                mlp_ratio, qkv_bias, qk_scale, rates[i], norm_layer, use_checkpoint_attn, use_checkpoint_ffn,
            )
            for i in range(depth)
        ])

    def forward(self, x: Tensor) -> Tensor:
        """x: (B, D, H, W, C) -> (B, D, H, W, C)."""
        _, d, h, w, _ = x.shape
        window, shift = get_window_size((d, h, w), self.window_size, self.shift_size)
        padded = tuple(math.ceil(n / ws) * ws for n, ws in zip((d, h, w), window))
        mask = compute_mask(*padded, window, shift, x.device) if len(self.blocks) > 1 else None
        for blk in self.blocks:
            x = blk(x, mask)
        return x


class RTMSA(nn.Module):
    """Residual TMSA group (stage 8): ``x + linear(TMSAG(x))`` with self-attention only, channels-last.

    Args:
        dim, depth, num_heads, window_size, mlp_ratio: see :class:`TMSAG`.
        qkv_bias: bias in the qkv projection (on by default here, unlike :class:`TMSAG`).
        **kwargs: ``qk_scale``, ``drop_path``, ``norm_layer``, ``use_checkpoint_attn``, ``use_checkpoint_ffn``.
    """

    def __init__(self, dim: int, depth: int, num_heads: int, window_size: Size3, mlp_ratio: float = 2.0,
                 qkv_bias: bool = True, **kwargs: Any) -> None:
        super().__init__()
        self.residual_group = TMSAG(dim, depth, num_heads, window_size, mut_attn=False, mlp_ratio=mlp_ratio,
                                    qkv_bias=qkv_bias, **kwargs)
        self.linear = nn.Linear(dim, dim)

    def forward(self, x: Tensor) -> Tensor:
        """x: (B, D, H, W, C) -> (B, D, H, W, C)."""
        return x + self.linear(self.residual_group(x))


def deform_conv3x3_sampled(x: Tensor, offset: Tensor, mask: Tensor, weight: Tensor, bias: Tensor) -> Tensor:
    """Modulated deformable 3x3 convolution (stride 1, padding 1) as bilinear sampling plus one matmul.

    Same semantics as ``torchvision.ops.deform_conv2d(x, offset, weight, bias, padding=(1, 1), mask=mask)``,
    including implicit weight groups (``x`` may have a multiple of ``weight``'s input channels) and zero
    contribution from samples outside the image.

    Args:
        x: (N, C_in, H, W).
        offset: (N, 2 * G * 9, H, W), per offset group and kernel point (dy, dx).
        mask: (N, G * 9, H, W) modulation.
        weight: (C_out, C_in / groups, 3, 3).
        bias: (C_out,).

    Returns:
        (N, C_out, H, W).
    """
    n, cin, h, w = x.shape
    cout, cin_g, kh, kw = weight.shape
    groups, off_groups, points = cin // cin_g, mask.shape[1] // (kh * kw), kh * kw
    ky, kx = torch.meshgrid(torch.arange(kh, dtype=x.dtype, device=x.device) - kh // 2,
                            torch.arange(kw, dtype=x.dtype, device=x.device) - kw // 2, indexing='ij')
    off = offset.view(n, off_groups, points, 2, h, w)
    py = torch.arange(h, dtype=x.dtype, device=x.device).view(h, 1) + ky.reshape(points, 1, 1) + off[:, :, :, 0]
    px = torch.arange(w, dtype=x.dtype, device=x.device) + kx.reshape(points, 1, 1) + off[:, :, :, 1]
    grid = torch.stack((2.0 * px / max(w - 1, 1) - 1.0, 2.0 * py / max(h - 1, 1) - 1.0), dim=-1)
    cols = F.grid_sample(x.view(n * off_groups, cin // off_groups, h, w), grid.view(n * off_groups, points * h, w, 2),
                         mode='bilinear', padding_mode='zeros', align_corners=True)
    cols = cols.view(n, off_groups, cin // off_groups, points, h, w) * mask.view(n, off_groups, 1, points, h, w)
    out = torch.matmul(weight.view(groups, cout // groups, cin_g * points), cols.view(n, groups, cin_g * points, h * w))
    return out.view(n, cout, h, w) + bias.view(1, cout, 1, 1)


class DCNv2PackFlowGuided(nn.Module):
    """Flow-guided deformable alignment of 1-3 neighbours (BasicVSR++ style), frame-batched.

    Args:
        channels: feature channels C (in and out).
        deformable_groups: offset groups over all neighbours together (divisible by pa_frames // 2).
        max_residue_magnitude: bound on the learned offset residue around the flow.
        pa_frames: 2, 4 or 6 (1, 2 or 3 neighbours per direction).
    """

    def __init__(self, channels: int, deformable_groups: int = 16, max_residue_magnitude: float = 10,
                 pa_frames: int = 2) -> None:
        super().__init__()
        self.max_residue_magnitude = max_residue_magnitude
        self.pa_frames = pa_frames
        c = channels
        self.weight = nn.Parameter(torch.empty(c, c, 3, 3))
        self.bias = nn.Parameter(torch.zeros(c))
        self.conv_offset = nn.Sequential(
            nn.Conv2d((1 + pa_frames // 2) * c + pa_frames, c, 3, 1, 1),
            nn.LeakyReLU(negative_slope=0.1, inplace=True),
            nn.Conv2d(c, c, 3, 1, 1),
            nn.LeakyReLU(negative_slope=0.1, inplace=True),
            nn.Conv2d(c, c, 3, 1, 1),
            nn.LeakyReLU(negative_slope=0.1, inplace=True),
            nn.Conv2d(c, 27 * deformable_groups, 3, 1, 1),
        )
        # 'auto': the grid_sample formulation on CPU (several times faster than torchvision's CPU kernel,
        # especially backward), torchvision's kernel elsewhere (it does not store the sampled columns)
        self.impl = 'auto'
        stdv = 1.0 / math.sqrt(c * 9)
        nn.init.uniform_(self.weight, -stdv, stdv)
        nn.init.zeros_(self.conv_offset[-1].weight)
        nn.init.zeros_(self.conv_offset[-1].bias)

    def forward(self, neighbours: Tensor, warped: Tensor, current: Tensor, flows: Tensor) -> Tensor:
        """Align neighbours to the current frame.

        Args:
            neighbours: (N, K*C, H, W) unwarped neighbours, K = pa_frames // 2.
            warped: (N, K*C, H, W) the neighbours flow-warped to the current frame.
            current: (N, C, H, W).
            flows: (N, K*2, H, W) flows (dx, dy) per neighbour.

        Returns:
            (N, C, H, W) aligned features.
        """
        out = self.conv_offset(torch.cat([warped, current, flows], dim=1))
        o1, o2, mask = torch.chunk(out, 3, dim=1)
        offset = self.max_residue_magnitude * torch.tanh(torch.cat((o1, o2), dim=1))
        k = self.pa_frames // 2
        # each neighbour's chunk of offsets gets its flow, flipped to (dy, dx) and repeated per point/group
        n, _, h, w = offset.shape
        offset = offset.view(n, k, -1, 2, h, w) + flows.view(n, k, 1, 2, h, w).flip(3)
        offset = offset.view(n, -1, h, w)
        impl = self.impl if self.impl != 'auto' else ('sampled' if offset.device.type == 'cpu' else 'torchvision')
        with torch.autocast(device_type=offset.device.type, enabled=False):
            args = (neighbours.float(), offset.float(), torch.sigmoid(mask.float()), self.weight.float(),
                    self.bias.float())
            if impl == 'torchvision':
                x, offset, mask, weight, bias = args
                return torchvision.ops.deform_conv2d(x, offset, weight, bias, padding=(1, 1), mask=mask)
            if impl != 'sampled':
                raise ValueError(f"DCNv2PackFlowGuided.impl must be 'auto', 'torchvision' or 'sampled', got {impl!r}")
            if torch.is_grad_enabled():  # recompute the sampled columns in backward instead of storing them
                return checkpoint(deform_conv3x3_sampled, *args, use_reentrant=False)
            return deform_conv3x3_sampled(*args)


class Stage(nn.Module):
    """Resolution change, TMSA groups (mutual+self, then self) and parallel warping, channels-last.

    Args:
        in_dim: channels of the input.
        dim: channels of this stage.
        depth: blocks; int(depth * mul_attn_ratio) of them use mutual attention.
        num_heads: attention heads.
        window_size: (Wd, Wh, Ww); the mutual-attention group uses (2, Wh, Ww).
        mul_attn_ratio: fraction of mutual-attention blocks.
        drop_path: per-block rates.
        pa_frames: frames used by parallel warping (0: none).
        deformable_groups: see :class:`DCNv2PackFlowGuided`.
        reshape: 'none', 'down' (space-to-depth 2x2) or 'up' (depth-to-space 2x2).
        max_residue_magnitude: see :class:`DCNv2PackFlowGuided`.
        Other arguments: see :class:`TMSA`.
    """

    def __init__(
        self,
        in_dim: int,
        dim: int,
        depth: int,
        num_heads: int,
        window_size: Size3,
        mul_attn_ratio: float = 0.75,
        mlp_ratio: float = 2.0,
        qkv_bias: bool = True,
        qk_scale: float | None = None,
        drop_path: float | Sequence[float] = 0.0,
        norm_layer: type[nn.Module] = nn.LayerNorm,
        pa_frames: int = 2,
        deformable_groups: int = 16,
        reshape: str = 'none',
        max_residue_magnitude: float = 10,
        use_checkpoint_attn: bool = False,
        use_checkpoint_ffn: bool = False,
    ) -> None:
        super().__init__()
        self.pa_frames = pa_frames
        # index 0 is the layout change so that the LayerNorm / Linear keep the reference's indices 1 / 2
        if reshape == 'none':
            self.reshape = nn.Sequential(nn.Identity(), nn.LayerNorm(dim))
        elif reshape == 'down':
            self.reshape = nn.Sequential(
                Rearrange('n d (h neih) (w neiw) c -> n d h w (neiw neih c)', neih=2, neiw=2),
                nn.LayerNorm(4 * in_dim), nn.Linear(4 * in_dim, dim),
            )
        elif reshape == 'up':
            self.reshape = nn.Sequential(
                Rearrange('n d h w (neiw neih c) -> n d (h neih) (w neiw) c', neih=2, neiw=2),
                nn.LayerNorm(in_dim // 4), nn.Linear(in_dim // 4, dim),
            )
        else:
            raise ValueError(f"Stage reshape must be 'none', 'down' or 'up', got {reshape!r}")
        n_mut = int(depth * mul_attn_ratio)
        rates = list(drop_path) if isinstance(drop_path, Sequence) else [drop_path] * depth
        common = {'mlp_ratio': mlp_ratio, 'qkv_bias': qkv_bias, 'qk_scale': qk_scale, 'norm_layer': norm_layer,
                  'use_checkpoint_attn': use_checkpoint_attn, 'use_checkpoint_ffn': use_checkpoint_ffn}
        self.residual_group1 = TMSAG(dim, n_mut, num_heads, (2, window_size[1], window_size[2]), True,
                                     drop_path=rates[:n_mut], **common)
        self.linear1 = nn.Linear(dim, dim)
        # the reference passes the full rate list to both groups, so block j of either group gets rates[j]
        self.residual_group2 = TMSAG(dim, depth - n_mut, num_heads, window_size, False,
                                     drop_path=rates[:depth - n_mut], **common)
        self.linear2 = nn.Linear(dim, dim)
        if pa_frames:
            self.pa_deform = DCNv2PackFlowGuided(dim, deformable_groups, max_residue_magnitude, pa_frames)
            self.pa_fuse = MlpGEGLU(dim * 3, dim * 3, dim)

    def forward(self, x: Tensor, flows_backward: Sequence[Tensor], flows_forward: Sequence[Tensor]) -> Tensor:
        """Run the stage.

        Args:
            x: (B, D, H', W', C_in) channels-last.
            flows_backward: pa_frames // 2 tensors at this stage's scale; entry k-1 is (B, D-k, 2, H, W), the
                flow from frame t+k to t.
            flows_forward: likewise, entry k-1 holds the flows from frame t-k to t (t = k .. D-1).

        Returns:
            (B, D, H, W, C).
        """
        x = self.reshape(x)
        x = self.linear1(self.residual_group1(x)) + x
        x = self.linear2(self.residual_group2(x)) + x
        if self.pa_frames:
            x_backward, x_forward = self._parallel_warp(x, flows_backward, flows_forward)
            x = self.pa_fuse(torch.cat([x, x_backward, x_forward], dim=4))
        return x

    def _parallel_warp(self, x: Tensor, flows_backward: Sequence[Tensor], flows_forward: Sequence[Tensor]):
        """Align neighbours t+1..t+K (backward) and t-1..t-K (forward) to every frame t in one batched pass.

        Missing neighbours at the clip borders are zeros (zero features and zero flow), and the last
        (backward) / first (forward) frame gets an all-zero result, as in the reference.
        """
        b, d, h, w, c = x.shape
        k_max = self.pa_frames // 2
        xf = x.permute(0, 1, 4, 2, 3)  # (B, D, C, H, W)

        def pad_frames(t: Tensor, n: int, front: bool) -> Tensor:
            if n == 0:
                return t
            zeros = t.new_zeros(t.shape[0], n, *t.shape[2:])
            return torch.cat([zeros, t] if front else [t, zeros], dim=1)

        srcs, flows = [], []
        for k in range(1, k_max + 1):  # backward: frame t+k aligned to t, for t = 0..D-2
            srcs.append(pad_frames(xf[:, k:], k - 1, front=False))
            flows.append(pad_frames(flows_backward[k - 1], k - 1, front=False))
        for k in range(1, k_max + 1):  # forward: frame t-k aligned to t, for t = 1..D-1
            srcs.append(pad_frames(xf[:, :d - k], k - 1, front=True))
            flows.append(pad_frames(flows_forward[k - 1], k - 1, front=True))
        src = torch.stack(srcs, 0)  # (2K, B, D-1, C, H, W): [bwd k=1..K, fwd k=1..K]
        flow = torch.stack(flows, 0)  # (2K, B, D-1, 2, H, W)
        warped = flow_warp(src.reshape(-1, c, h, w), flow.reshape(-1, 2, h, w).permute(0, 2, 3, 1))

        def per_sample(t: Tensor, ch: int) -> Tensor:
            # (2K, B, D-1, ch, H, W) -> (2 * B * (D-1), K * ch, H, W), directions stacked along the batch
            t = t.view(2, k_max, b * (d - 1), ch, h, w).permute(0, 2, 1, 3, 4, 5)
            return t.reshape(2 * b * (d - 1), k_max * ch, h, w)

        current = torch.cat([xf[:, :-1], xf[:, 1:]], 0).reshape(-1, c, h, w)
        aligned = self.pa_deform(
            per_sample(src, c), per_sample(warped.view(src.shape), c), current, per_sample(flow, 2)
        ).view(2, b, d - 1, c, h, w).permute(0, 1, 2, 4, 5, 3)
        zero = x.new_zeros(b, 1, h, w, c)
        aligned = aligned.to(x.dtype)
        return torch.cat([aligned[0], zero], 1), torch.cat([zero, aligned[1]], 1)


# ----------------------------------------------------------------------------------------------------------
# VRT
# ----------------------------------------------------------------------------------------------------------
class VRT(nn.Module):
    """Video Restoration Transformer.

    Args:
        upscale: SR factor (1 for deblurring / denoising / interpolation).
        in_chans: image channels of the input (the noise map comes on top for non-blind denoising).
        out_chans: output channels.
        img_size: (D, H, W) training clip size; D must equal the input frames when pa_frames == 0.
        window_size: (Wd, Wh, Ww) attention window.
        depths: blocks per stage: 7 U-shaped stages, then the stage-8 groups.
        indep_reconsts: stage-8 indices whose attention is per frame (window (1, Wh, Ww)).
        embed_dims: channels per stage (same length as depths).
        num_heads: heads per stage.
        mul_attn_ratio: fraction of mutual-attention blocks in stages 1-7.
        mlp_ratio: MLP hidden / dim.
        qkv_bias, qk_scale: attention projections.
        drop_path_rate: stochastic depth, linearly increasing over all blocks.
        norm_layer: normalisation class.
        spynet_path: SpyNet weights file (must exist), or None for random SpyNet weights.
        pa_frames: 2, 4 or 6 frames for parallel warping; 0 for frame interpolation.
        deformable_groups: offset groups of the alignment.
        recal_all_flows: kept for configuration compatibility (unused, as in the reference).
        nonblind_denoising: the input carries a noise-level map as channel ``in_chans``.
        use_checkpoint_attn, use_checkpoint_ffn: activation checkpointing of every block's halves.
        no_checkpoint_attn_blocks, no_checkpoint_ffn_blocks: stage indices (0-6 stages 1-7, >= 7 stage-8
            groups) excluded from checkpointing.
    """

    def __init__(
        self,
        upscale: int = 4,
        in_chans: int = 3,
        out_chans: int = 3,
        img_size: Sequence[int] = (6, 64, 64),
        window_size: Sequence[int] = (6, 8, 8),
        depths: Sequence[int] = (8, 8, 8, 8, 8, 8, 8, 4, 4, 4, 4, 4, 4),
        indep_reconsts: Sequence[int] = (11, 12),
        embed_dims: Sequence[int] = (120, 120, 120, 120, 120, 120, 120, 180, 180, 180, 180, 180, 180),
        num_heads: Sequence[int] = (6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6),
        mul_attn_ratio: float = 0.75,
        mlp_ratio: float = 2.0,
        qkv_bias: bool = True,
        qk_scale: float | None = None,
        drop_path_rate: float = 0.2,
        norm_layer: type[nn.Module] = nn.LayerNorm,
        spynet_path: str | os.PathLike | None = None,
        pa_frames: int = 2,
        deformable_groups: int = 16,
        recal_all_flows: bool = False,
        nonblind_denoising: bool = False,
        use_checkpoint_attn: bool = False,
        use_checkpoint_ffn: bool = False,
        no_checkpoint_attn_blocks: Sequence[int] = (),
        no_checkpoint_ffn_blocks: Sequence[int] = (),
    ) -> None:
        super().__init__()
        if pa_frames not in (0, 2, 4, 6):
            raise ValueError(f'VRT pa_frames must be 0, 2, 4 or 6, got {pa_frames}')
        n_stages = len(depths)
        if n_stages < 8 or len(embed_dims) != n_stages or len(num_heads) != n_stages:
            raise ValueError(
                f'VRT depths, embed_dims and num_heads need the same length >= 8, got {len(depths)}, '
                f'{len(embed_dims)}, {len(num_heads)}'
            )
        self.in_chans = in_chans
        self.out_chans = out_chans
        self.upscale = upscale
        self.img_size = tuple(img_size)
        self.window_size = tuple(window_size)
        self.pa_frames = pa_frames
        self.recal_all_flows = recal_all_flows
        self.nonblind_denoising = nonblind_denoising
        window = tuple(window_size)

        if pa_frames:
            first_in = in_chans * (1 + 2 * 4) + (1 if nonblind_denoising else 0)
        else:
            first_in = in_chans
        self.conv_first = FrameConv(first_in, embed_dims[0])
        if pa_frames:
            self.spynet = SpyNet(spynet_path, (2, 3, 4, 5))

        dpr = torch.linspace(0, drop_path_rate, sum(depths), device='cpu').tolist()
        ckpt_attn = [use_checkpoint_attn and i not in no_checkpoint_attn_blocks for i in range(n_stages)]
        ckpt_ffn = [use_checkpoint_ffn and i not in no_checkpoint_ffn_blocks for i in range(n_stages)]
        common = {'mlp_ratio': mlp_ratio, 'qkv_bias': qkv_bias, 'qk_scale': qk_scale, 'norm_layer': norm_layer}
        scales = (1, 2, 4, 8, 4, 2, 1)
        reshapes = ('none', 'down', 'down', 'down', 'up', 'up', 'up')
        for i in range(7):
            self.add_module(f'stage{i + 1}', Stage(
                in_dim=embed_dims[i - 1], dim=embed_dims[i], depth=depths[i], num_heads=num_heads[i],
                window_size=window, mul_attn_ratio=mul_attn_ratio, drop_path=dpr[sum(depths[:i]):sum(depths[:i + 1])],
                pa_frames=pa_frames, deformable_groups=deformable_groups, reshape=reshapes[i],
                max_residue_magnitude=10 / scales[i], use_checkpoint_attn=ckpt_attn[i],
                use_checkpoint_ffn=ckpt_ffn[i], **common,
            ))
        # index 0 stands for the reference's layout change, keeping LayerNorm / Linear at indices 1 / 2
        self.stage8 = nn.ModuleList([
            nn.Sequential(nn.Identity(), nn.LayerNorm(embed_dims[6]), nn.Linear(embed_dims[6], embed_dims[7]))
        ])
        for i in range(7, n_stages):
            self.stage8.append(RTMSA(
                embed_dims[i], depths[i], num_heads[i],
                (1, window[1], window[2]) if i in indep_reconsts else window,
                drop_path=dpr[sum(depths[:i]):sum(depths[:i + 1])], use_checkpoint_attn=ckpt_attn[i],
                use_checkpoint_ffn=ckpt_ffn[i], **common,
            ))
        self.norm = norm_layer(embed_dims[-1])
        self.conv_after_body = nn.Linear(embed_dims[-1], embed_dims[0])

        num_feat = 64
        if pa_frames:
            if upscale == 1:
                self.conv_last = FrameConv(embed_dims[0], out_chans)
            else:
                self.conv_before_upsample = nn.Sequential(
                    FrameConv(embed_dims[0], num_feat), nn.LeakyReLU(inplace=True)
                )
                self.upsample = Upsample(upscale, num_feat)
                self.conv_last = FrameConv(num_feat, out_chans)
        else:
            self.linear_fuse = nn.Conv2d(embed_dims[0] * self.img_size[0], num_feat, kernel_size=1, stride=1)
            self.conv_last = nn.Conv2d(num_feat, out_chans, kernel_size=7, stride=1, padding=0)

    # ---------------------------------------------------------------------------------------------- flows
    def get_flows(self, x: Tensor) -> tuple[list[Tensor], list[Tensor]]:
        """Optical flows for parallel warping.

        Args:
            x: (B, D, 3, H, W) in [0, 1].

        Returns:
            (flows_backward, flows_forward), each a list of 4 * (pa_frames // 2) tensors ordered
            [dist 1 at scales 1, 1/2, 1/4, 1/8, dist 2 at the 4 scales, dist 3 ...]; the distance-k tensor at
            scale s is (B, D-k, 2, H/s, W/s). Backward: flow from t+k to t; forward: from t-k to t.
        """
        b, d, c, h, w = x.shape
        x1 = x[:, :-1].reshape(-1, c, h, w)
        x2 = x[:, 1:].reshape(-1, c, h, w)
        # both directions in one SpyNet call: backward = spynet(x_t, x_t+1), forward = spynet(x_t+1, x_t)
        pyramid = self.spynet(torch.cat([x1, x2], 0), torch.cat([x2, x1], 0))
        backward1, forward1 = [], []
        for i, flow in enumerate(pyramid):
            flow = flow.view(2, b, d - 1, 2, h // 2**i, w // 2**i)
            backward1.append(flow[0])
            forward1.append(flow[1])
        flows_backward, flows_forward = list(backward1), list(forward1)
        if self.pa_frames >= 4:
            backward2 = [self._compose(f[:, :-1], f[:, 1:]) for f in backward1]
            forward2 = [self._compose(f[:, 1:], f[:, :-1]) for f in forward1]
            flows_backward += backward2
            flows_forward += forward2
        if self.pa_frames == 6:
            flows_backward += [self._compose(f2[:, :-1], f1[:, 2:]) for f1, f2 in zip(backward1, backward2)]
            flows_forward += [self._compose(f2[:, 1:], f1[:, :-2]) for f1, f2 in zip(forward1, forward2)]
        return flows_backward, flows_forward

    @staticmethod
    def _compose(first: Tensor, second: Tensor) -> Tensor:
        """Chain flows: ``first + warp(second, first)`` per frame. first, second: (B, T, 2, H, W)."""
        b, t, _, h, w = first.shape
        if t == 0:
            raise ValueError('VRT pa_frames 4 needs at least 3 input frames and pa_frames 6 at least 4')
        f1 = first.reshape(-1, 2, h, w)
        return (f1 + flow_warp(second.reshape(-1, 2, h, w), f1.permute(0, 2, 3, 1))).view(b, t, 2, h, w)

    @staticmethod
    def _align_images(x: Tensor, flow_backward: Tensor, flow_forward: Tensor) -> tuple[Tensor, Tensor]:
        """Nearest-4 pre-alignment of the input frames.

        Args:
            x: (B, D, C, H, W); flow_backward/forward: (B, D-1, 2, H, W) at full scale.

        Returns:
            x_backward, x_forward: (B, D, 4C, H, W); frame t+1 (resp. t-1) sampled at its 4 integer neighbours
            around the flow target, zeros for the last (resp. first) frame.
        """
        b, d, c, h, w = x.shape
        src = torch.cat([x[:, 1:], x[:, :-1]], 0).reshape(-1, c, h, w)
        flow = torch.cat([flow_backward, flow_forward], 0).reshape(-1, 2, h, w).permute(0, 2, 3, 1)
        warped = flow_warp(src, flow, 'nearest4').view(2, b, d - 1, 4 * c, h, w)
        zero = x.new_zeros(b, 1, 4 * c, h, w)
        return torch.cat([warped[0], zero], 1), torch.cat([zero, warped[1]], 1)

    # ------------------------------------------------------------------------------------------- forward
    def forward_features(self, x: Tensor, flows_backward: list[Tensor], flows_forward: list[Tensor]) -> Tensor:
        """U-shaped stages 1-7, stage 8 and the final norm: (B, D, H, W, C0) -> (B, D, H, W, C_last)."""
        x1 = self.stage1(x, flows_backward[0::4], flows_forward[0::4])
        x2 = self.stage2(x1, flows_backward[1::4], flows_forward[1::4])
        x3 = self.stage3(x2, flows_backward[2::4], flows_forward[2::4])
        x4 = self.stage4(x3, flows_backward[3::4], flows_forward[3::4])
        x = self.stage5(x4, flows_backward[2::4], flows_forward[2::4])
        x = self.stage6(x + x3, flows_backward[1::4], flows_forward[1::4])
        x = self.stage7(x + x2, flows_backward[0::4], flows_forward[0::4])
        x = x + x1
        for layer in self.stage8:
            x = layer(x)
        return self.norm(x)

    def _body(self, x: Tensor, flows_backward: list[Tensor], flows_forward: list[Tensor]) -> Tensor:
        """conv_first, features and the long skip: (B, D, C_in, H, W) -> (B, D, H, W, C0)."""
        b, d, c, h, w = x.shape
        x = self.conv_first(x.reshape(b * d, c, h, w))
        x = x.view(b, d, -1, h, w).permute(0, 1, 3, 4, 2)
        return x + self.conv_after_body(self.forward_features(x, flows_backward, flows_forward))

    def forward(self, x: Tensor) -> Tensor:
        """Restore a clip.

        Args:
            x: (B, D, C, H, W) in [0, 1]; C = in_chans (+1 noise-level channel for non-blind denoising).
                H and W must be multiples of 8 and (with parallel warping) above 32.

        Returns:
            (B, D, out_chans, upscale * H, upscale * W); frame interpolation returns (B, 1, out_chans, H, W).
        """
        if x.dim() != 5:
            raise ValueError(f'VRT expects input (B, D, C, H, W), got shape {tuple(x.shape)}')
        self._check_size(*x.shape[-2:])
        if not self.pa_frames:
            return self._forward_interpolation(x)
        expected = self.in_chans + (1 if self.nonblind_denoising else 0)
        if x.shape[2] != expected:
            raise ValueError(f'VRT expects {expected} input channels, got {x.shape[2]}')
        if x.shape[1] < 2:
            raise ValueError(f'VRT with pa_frames={self.pa_frames} needs at least 2 frames, got {x.shape[1]}')
        noise_map = x[:, :, self.in_chans:] if self.nonblind_denoising else None
        x_lq = x[:, :, :self.in_chans]
        flows_backward, flows_forward = self.get_flows(x_lq)
        x_backward, x_forward = self._align_images(x_lq, flows_backward[0], flows_forward[0])
        parts = [x_lq, x_backward, x_forward] + ([noise_map] if noise_map is not None else [])
        feat = self._body(torch.cat(parts, 2), flows_backward, flows_forward)
        b, d, h, w, c = feat.shape
        feat = feat.permute(0, 1, 4, 2, 3).reshape(b * d, c, h, w)
        if self.upscale == 1:
            out = self.conv_last(feat)
            return out.view(b, d, -1, h, w) + x_lq
        out = self.conv_last(self.upsample(self.conv_before_upsample(feat)))
        out = out.view(b, d, -1, *out.shape[-2:])
        return out + F.interpolate(x_lq, size=out.shape[2:], mode='trilinear', align_corners=False)

    def _check_size(self, h: int, w: int) -> None:
        """Sizes the architecture supports: sides divisible by 8 (three 2x downsamplings), the 1/8 scale at least
        the attention window (mutual attention has a fixed-size position bias), and above 32 px for SpyNet."""
        min_h, min_w = 8 * self.window_size[1], 8 * self.window_size[2]
        if self.pa_frames:
            min_h, min_w = max(min_h, 40), max(min_w, 40)
        if h % 8 or w % 8 or h < min_h or w < min_w:
            why = f'8 x window {tuple(self.window_size[1:])}' + (', above 32 px for SpyNet' if self.pa_frames else '')
            raise ValueError(
                f'VRT input frames must have H, W divisible by 8 and at least {min_h}x{min_w} ({why}), '
                f'got {h}x{w}; pad or tile the input'
            )

    def _forward_interpolation(self, x: Tensor) -> Tensor:
        """Frame interpolation (pa_frames == 0): (B, D, C, H, W) with D = img_size[0] -> (B, 1, C_out, H, W)."""
        if x.shape[1] != self.img_size[0]:
            raise ValueError(
                f'VRT frame interpolation needs D == img_size[0] == {self.img_size[0]} input frames, got {x.shape[1]}'
            )
        x_mean = x.mean([1, 3, 4], keepdim=True)
        feat = self._body(x - x_mean, [], [])  # (B, D, H, W, C0)
        b, d, h, w, c = feat.shape
        feat = feat.permute(0, 1, 4, 2, 3).reshape(b, d * c, h, w)  # frames concatenated along channels
        out = F.leaky_relu(self.linear_fuse(feat), 0.2)
        out = self.conv_last(F.pad(out, (3, 3, 3, 3), mode='reflect'))
        return out.view(b, -1, 3, h, w) + x_mean
