"""The CUDA guided deformable attention kernel as a per-pixel loop, and random inputs for it: the reference that
our operator (models/layers_deform_attn.py) and the benchmark's stand-in for the reference network
(benchmarks/rvrt_standin.py) are both tested against."""

from __future__ import annotations

import math

import torch


def _bilinear(img: torch.Tensor, h: float, w: float) -> torch.Tensor:
    """``dmcn_im2col_bilinear`` of the CUDA kernel for all channels of img (C, H, W), with its range test."""
    height, width = img.shape[1:]
    if not (h > -1 and w > -1 and h < height and w < width):
        return img.new_zeros(img.shape[0])
    h_low, w_low = math.floor(h), math.floor(w)
    h_high, w_high = h_low + 1, w_low + 1
    lh, lw = h - h_low, w - w_low
    hh, hw = 1 - lh, 1 - lw
    val = img.new_zeros(img.shape[0])
    if h_low >= 0 and w_low >= 0:
        val = val + hh * hw * img[:, h_low, w_low]
    if h_low >= 0 and w_high <= width - 1:
        val = val + hh * lw * img[:, h_low, w_high]
    if h_high <= height - 1 and w_low >= 0:
        val = val + lh * hw * img[:, h_high, w_low]
    if h_high <= height - 1 and w_high <= width - 1:
        val = val + lh * lw * img[:, h_high, w_high]
    return val


def naive_deform_attn(q, kv, offset, kh, kw, stride, pad, dil, heads, groups, clip):
    """Per-pixel loop following deform_attn_cuda_forward + modulated_deformable_im2col (mask = 1)."""
    b_total = q.shape[0]
    _, _, c2, height, width = kv.shape
    c, kk = c2 // 2, kh * kw
    hd, cg = c // heads, c2 // groups
    qf = q.reshape(b_total, c, height, width)
    off = offset.reshape(b_total, clip, groups, kk, 2, height, width)
    out = torch.zeros(b_total, c, height, width, dtype=q.dtype)
    for b in range(b_total):
        for y in range(height):
            for x in range(width):
                samples = torch.zeros(clip * kk, c2, dtype=q.dtype)
                for n in range(clip):
                    frame = kv[b // clip, (n + b) % clip]
                    for g in range(groups):
                        for i in range(kh):
                            for j in range(kw):
                                k = i * kw + j
                                py = y * stride - pad + i * dil + float(off[b, n, g, k, 0, y, x])
                                px = x * stride - pad + j * dil + float(off[b, n, g, k, 1, y, x])
                                samples[n * kk + k, g * cg:(g + 1) * cg] = _bilinear(frame[g * cg:(g + 1) * cg], py, px)
                for h in range(heads):
                    qv = qf[b, h * hd:(h + 1) * hd, y, x] * hd**-0.5
                    keys = samples[:, h * hd:(h + 1) * hd]
                    values = samples[:, c + h * hd:c + (h + 1) * hd]
                    attn = torch.softmax(keys @ qv, dim=0)
                    out[b, h * hd:(h + 1) * hd, y, x] = attn @ values
    return out.view(q.shape)


def attn_inputs(n=1, clip=2, c=4, h=5, w=6, groups=2, kh=3, kw=3, scale=2.5, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(n * clip, 1, c, h, w, generator=g, dtype=dtype)
    kv = torch.randn(n, clip, 2 * c, h, w, generator=g, dtype=dtype)
    offset = scale * torch.randn(n * clip, clip * groups * kh * kw * 2, h, w, generator=g, dtype=dtype)
    return q, kv, offset
