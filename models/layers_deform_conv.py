"""Flow-guided deformable convolution of VRT's parallel warping (torchvision's kernel or a sampled formulation).

Under :func:`models.layers_warp.deterministic_kernels` the sampled formulation runs whenever autograd needs the
convolution (its sampling then has a deterministic backward): torchvision's backward accumulates with atomic adds.
"""

from __future__ import annotations

import math

import torch
import torchvision
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from models.layers_conv import cat_layout, conv_act, eager_no_grad
from models.layers_warp import autocast_off, deterministic_kernels, grid_sample

# Bytes of sampled columns (C_in x 9 values per output pixel) that one call of the sampled formulation builds at
# most: larger inputs are cut into groups of samples, or into bands of output rows of one sample (a band samples the
# whole input), each a call of its own. The output is the same bit for bit (every output pixel is the same sum of the
# same products); with autograd, the weight and input gradients are sums over the pieces (rounding-level changes, and
# only for inputs above this size). Without it a 16-frame 180 x 320 clip of the demo's VRT built 1.4 GB of columns,
# and as much again for their modulated copy, per alignment (benchmarks/RESULTS.md, "Host memory of CPU inference").
DEFORM_COLUMNS_BYTES = 256 * 2**20


def deform_conv3x3_sampled(x: Tensor, offset: Tensor, mask: Tensor, weight: Tensor, bias: Tensor,
                           row0: int = 0) -> Tensor:
    """Modulated deformable 3x3 convolution (stride 1, padding 1) as bilinear sampling plus one matmul.

    Same semantics as ``torchvision.ops.deform_conv2d(x, offset, weight, bias, padding=(1, 1), mask=mask)``,
    including implicit weight groups (``x`` may have a multiple of ``weight``'s input channels) and zero
    contribution from samples outside the image. The sampling is :func:`models.layers_warp.grid_sample`
    (deterministic under :func:`models.layers_warp.deterministic_kernels`).

    Args:
        x: (N, C_in, H, W).
        offset: (N, 2 * G * 9, Ho, W), per offset group and kernel point (dy, dx), for output rows
            ``row0 .. row0 + Ho - 1`` (all of them by default: Ho = H).
        mask: (N, G * 9, Ho, W) modulation.
        weight: (C_out, C_in / groups, 3, 3).
        bias: (C_out,).
        row0: the first output row that ``offset`` and ``mask`` describe.

    Returns:
        (N, C_out, Ho, W): output rows ``row0 .. row0 + Ho - 1``.
    """
    n, cin, h, w = x.shape
    ho = offset.shape[2]
    cout, cin_g, kh, kw = weight.shape
    groups, off_groups, points = cin // cin_g, mask.shape[1] // (kh * kw), kh * kw
    ky, kx = torch.meshgrid(torch.arange(kh, dtype=x.dtype, device=x.device) - kh // 2,
                            torch.arange(kw, dtype=x.dtype, device=x.device) - kw // 2, indexing='ij')
    off = offset.view(n, off_groups, points, 2, ho, w)
    rows = torch.arange(row0, row0 + ho, dtype=x.dtype, device=x.device).view(ho, 1)
    dy, dx = off.unbind(3)  # unbind, not two selects: its backward is one stack, not two zero-filled tensors summed
    base_y, base_x = rows + ky.reshape(points, 1, 1), torch.arange(w, dtype=x.dtype, device=x.device) + kx.reshape(
        points, 1, 1)
    # align_corners=False with (2p + 1) / size - 1 maps back to pixel p, for a size of 1 too; in place on the new
    # tensors (none of these ops keeps its output for backward): fewer large allocations, the same bits
    if eager_no_grad():  # the two coordinates written straight into the grid: no stack copy, two tensors fewer
        # the doubling folded into the sums: (b + d) * 2 == 2b + 2 * d bit for bit (a factor of 2 is exact, so a fused
        # multiply-add rounds once, as the sum did); a square frame divided by one scalar (vectorised; the [w, h]
        # divisor broadcast over the last axis of 2 was not): 1.88 -> 1.19 ms a call for BasicVSR++'s (16, 9, 64, 64)
        # grid, the same bits (benchmarks/RESULTS.md, "BasicVSR++ forward, session 6")
        grid = x.new_empty(n, off_groups, points, ho, w, 2)
        torch.add(base_x * 2, dx, alpha=2, out=grid[..., 0])
        torch.add(base_y * 2, dy, alpha=2, out=grid[..., 1])
        grid.add_(1).div_(w if w == h else torch.tensor([w, h], dtype=x.dtype, device=x.device)).sub_(1)
    else:
        px, py = base_x + dx, base_y + dy
        grid = torch.stack((px.mul_(2).add_(1).div_(w).sub_(1), py.mul_(2).add_(1).div_(h).sub_(1)), dim=-1)
    # sampled from NCHW (a copy of a channels-last input, the same bits): BasicVSR++'s (1, 128, 64, 64) sampled in 16
    # groups of 8 channels took 8.6 ms a call with the copy against 9.3 ms from the channels-last view
    # (benchmarks/RESULTS.md, "BasicVSR++ forward past 2x"); several channels-last samples were copied anyway
    cols = grid_sample(x.contiguous().reshape(n * off_groups, cin // off_groups, h, w),
                       grid.view(n * off_groups, points * ho, w, 2), mode='bilinear', padding_mode='zeros',
                       align_corners=False)
    cols = cols.view(n, off_groups, cin // off_groups, points, ho, w)
    modulation = mask.view(n, off_groups, 1, points, ho, w)
    # in place where autograd does not keep the columns (one copy of the largest tensor less)
    cols = cols.mul_(modulation) if not torch.is_grad_enabled() else cols * modulation
    out = torch.matmul(weight.view(groups, cout // groups, cin_g * points),
                       cols.view(n, groups, cin_g * points, ho * w))
    return out.view(n, cout, ho, w).add_(bias.view(1, cout, 1, 1))  # in place: the product is not kept for backward


def _pieces(n: int, h: int, row_bytes: int) -> list[tuple[slice, slice]]:
    """(samples, output rows) of each call, so that one call's columns stay within :data:`DEFORM_COLUMNS_BYTES`;
    ``row_bytes``: column bytes of one output row of one sample."""
    budget = DEFORM_COLUMNS_BYTES
    if row_bytes * h <= budget:
        step = max(1, budget // (row_bytes * h))
        return [(slice(s, min(s + step, n)), slice(0, h)) for s in range(0, n, step)]
    rows = max(1, budget // row_bytes)
    return [(slice(s, s + 1), slice(r, min(r + rows, h))) for s in range(n) for r in range(0, h, rows)]


def _sampled(x: Tensor, offset: Tensor, mask: Tensor, weight: Tensor, bias: Tensor) -> Tensor:
    """:func:`deform_conv3x3_sampled` in pieces of at most :data:`DEFORM_COLUMNS_BYTES` of columns; with autograd,
    each piece recomputes its columns in backward instead of storing them."""
    n, cin, h, w = x.shape
    pieces = _pieces(n, h, cin * 9 * w * x.element_size())
    grad = torch.is_grad_enabled()
    outs: list[Tensor] = []
    for samples, rows in pieces:
        args = (x[samples], offset[samples, :, rows], mask[samples, :, rows], weight, bias)
        kwargs = {'row0': rows.start} if rows.start or rows.stop != h else {}
        if grad:  # recompute the sampled columns in backward instead of storing them
            outs.append(checkpoint(deform_conv3x3_sampled, *args, use_reentrant=False, **kwargs))
        else:
            outs.append(deform_conv3x3_sampled(*args, **kwargs))
    if len(outs) == 1:
        return outs[0]
    if pieces[0][1] == slice(0, h):  # groups of whole samples
        return torch.cat(outs, 0)
    per_sample = len(pieces) // n  # bands of rows, sample after sample
    return torch.cat([torch.cat(outs[i:i + per_sample], 2) for i in range(0, len(outs), per_sample)], 0)


def modulated_deform_conv3x3(x: Tensor, offset: Tensor, mask_logits: Tensor, weight: Tensor, bias: Tensor,
                             impl: str = 'auto', owner: str = 'deformable convolution') -> Tensor:
    """Modulated deformable 3x3 convolution (DCNv2, padding 1) in ``offset``'s dtype, with autocast off.

    Args:
        x: (N, Cin, H, W).
        offset: (N, 2 * G * 9, H, W) (dy, dx) pairs per group and kernel point, already in the working dtype
            (fp32, or fp64 for fp64 inputs: offsets need sub-pixel precision that bf16 does not have).
        mask_logits: (N, G * 9, H, W) modulation before the sigmoid.
        weight: (Cout, Cin, 3, 3); bias: (Cout,).
        impl: ``'auto'`` (the sampled formulation on the CPU, faster than torchvision's CPU kernel, backward
            especially; torchvision's kernel elsewhere), ``'torchvision'`` or ``'sampled'``. Deterministic mode
            takes the sampled one while autograd records: torchvision's backward accumulates with atomic adds.
        owner: the calling module's name, for the error message.

    Returns:
        (N, Cout, H, W) in the working dtype.
    """
    work = offset.dtype
    impl = impl if impl != 'auto' else ('sampled' if offset.device.type == 'cpu' else 'torchvision')
    if deterministic_kernels(offset) and torch.is_grad_enabled():
        impl = 'sampled'
    with autocast_off(offset.device):
        args = (x.to(work), offset, torch.sigmoid(mask_logits.to(work)), weight.to(work), bias.to(work))
        if impl == 'torchvision':
            inp, off, mask, w, b = args
            return torchvision.ops.deform_conv2d(inp, off, w, b, padding=(1, 1), mask=mask)
        if impl != 'sampled':
            raise ValueError(f"{owner}.impl must be 'auto', 'torchvision' or 'sampled', got {impl!r}")
        return _sampled(*args)


def flow_guided_offsets(raw: Tensor, flows: Tensor, magnitude: float) -> Tensor:
    """``magnitude * tanh(raw) + flows``: the offsets of a flow-guided alignment (VRT, BasicVSR++, RVRT).

    Args:
        raw: (N, K * P * 2, H, W) offset logits, K neighbours of P (group, kernel point) pairs each, (dy, dx) last;
            any layout (a slice of a channels-last convolution output).
        flows: (N, K, 1, 2, H, W) each neighbour's flow as (dy, dx), in the working dtype (float32, or float64).

    Returns:
        (N, K * P * 2, H, W) contiguous, in ``flows``' dtype. Without autograd ``tanh`` writes straight into a
        contiguous tensor and the rest runs in place; with it, tanh's backward keeps its output, so no step is in
        place (the same values).
    """
    n, k, _, _, h, w = flows.shape
    if not eager_no_grad():
        offset = magnitude * torch.tanh(raw.contiguous().to(flows.dtype))
        return (offset.view(n, k, -1, 2, h, w) + flows).view(n, -1, h, w)
    offset = torch.tanh(raw.to(flows.dtype), out=torch.empty(raw.shape, dtype=flows.dtype, device=raw.device))
    offset.mul_(magnitude).view(n, k, -1, 2, h, w).add_(flows)
    return offset


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
        # the offset branch in the layout its convolutions run fastest on (channels-last on the CPU: its last
        # convolution, 27 x groups outputs, ran 2.8x slower on NCHW input on an AMD EPYC with AVX-512;
        # benchmarks/RESULTS.md, "Issue 29 on an AMD EPYC with AVX-512"), LeakyReLU fused where it can be
        out = cat_layout([warped, current, flows.to(warped.dtype)])
        for conv in self.conv_offset[:-1:2]:
            out = conv_act(conv, out, 0.1)
        out = self.conv_offset[-1](out)
        third = out.shape[1] // 3  # offsets (dy, dx) of the two halves, then the mask logits
        # split, not two slices: its backward is one cat, not two zero-filled tensors summed
        offset, mask = out.split([2 * third, third], 1)
        mask = mask.contiguous()
        # offsets and the convolution in fp32 even under autocast (float64 stays float64): the residue (up to
        # 10 px) plus the flow needs sub-pixel precision that bf16 does not have
        work = torch.float64 if out.dtype == torch.float64 else torch.float32
        n, _, h, w = out.shape
        # each neighbour's chunk of offsets gets its flow, flipped to (dy, dx) and repeated per point/group
        flows = flows.to(work).view(n, self.pa_frames // 2, 1, 2, h, w).flip(3)
        offset = flow_guided_offsets(offset, flows, self.max_residue_magnitude)
        return modulated_deform_conv3x3(neighbours, offset, mask, self.weight, self.bias, self.impl,
                                        type(self).__name__)
