"""The modules built on RVRT's guided deformable attention (:mod:`models.layers_deform_attn`, the operator).

* :class:`GuidedDeformAttnPack`: RVRT's flow-guided alignment of the previous clip's features to the current clip
  (offsets from a Conv3d stack plus the optical flows, q/k/v projections, the operator, an MLP);
* :class:`DeformAttnPack`: one query frame attending to a clip, offsets from one 3x3 convolution;
* :class:`ChannelsLast`: a channels-last module applied to (N, D, C, H, W), registered under the reference's
  ``Sequential`` index so that the state-dict names match the reference's.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from timm.layers import Mlp
from torch import Tensor, nn

from models.layers_conv import cat_layout, conv_act, eager_no_grad, frame_conv
from models.layers_deform_attn import attend, check_shapes, clip_frames, kv_parts, pair, work_dtype
from models.layers_deform_conv import flow_guided_offsets


class ChannelsLast(nn.Module):
    """Apply a channels-last module to the channel axis of (N, D, C, H, W).

    The wrapped module is registered as ``'1'``, the index it has in the reference's
    ``Sequential(Rearrange, module, Rearrange)``, so state-dict keys read e.g. ``proj_q.1.weight``.
    """

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.add_module('1', module)

    def forward(self, x: Tensor) -> Tensor:
        """x: (N, D, C_in, H, W) -> (N, D, C_out, H, W)."""
        return getattr(self, '1')(x.movedim(2, -1)).movedim(-1, 2)


class _DeformAttnGeometry(nn.Module):
    """The sampling geometry both attention modules share: a (kh, kw) window, stride 1, 'same' padding."""

    def __init__(self, in_channels: int, out_channels: int | None, attention_window: Sequence[int],
                 deformable_groups: int, attention_heads: int, clip_size: int) -> None:
        super().__init__()
        self.in_channels = in_channels
        self.out_channels = out_channels or in_channels
        self.kernel_h, self.kernel_w = pair(attention_window)
        self.attn_size = self.kernel_h * self.kernel_w
        self.deformable_groups = deformable_groups
        self.attention_heads = attention_heads
        self.clip_size = clip_size
        self.stride, self.padding, self.dilation = 1, self.kernel_h // 2, 1

    def _params(self) -> tuple:
        """The geometry as :func:`models.layers_deform_attn.attend` takes it."""
        return ((self.kernel_h, self.kernel_w), (self.stride,) * 2, (self.padding,) * 2, (self.dilation,) * 2,
                self.attention_heads, self.deformable_groups)


class DeformAttnPack(_DeformAttnGeometry):
    """Deformable attention of one query frame over a clip, offsets predicted by one 3x3 convolution.

    State-dict names follow the reference's ``DeformAttnPack``: ``conv_offset``, ``proj_q.1``, ``proj_k.1``,
    ``proj_v.1``, ``mlp.1.fc1``, ``mlp.1.fc2``. The offset convolution is zero-initialised.

    Args:
        in_channels: feature channels C.
        out_channels: kept for the reference signature (the output has C channels).
        attention_window: (kh, kw).
        deformable_groups: offset groups over the 2C kv channels.
        attention_heads: heads over C.
        clip_size: kv frames S.
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int | None = None,
        attention_window: Sequence[int] = (3, 3),
        deformable_groups: int = 12,
        attention_heads: int = 12,
        clip_size: int = 1,
    ) -> None:
        super().__init__(in_channels, out_channels, attention_window, deformable_groups, attention_heads, clip_size)
        c = in_channels
        self.proj_q = ChannelsLast(nn.Linear(c, c))
        self.proj_k = ChannelsLast(nn.Linear(c, c))
        self.proj_v = ChannelsLast(nn.Linear(c, c))
        self.mlp = ChannelsLast(Mlp(c, 2 * c))
        self.conv_offset = nn.Conv2d(c * (1 + clip_size), clip_size * deformable_groups * self.attn_size * 2, 3, 1, 1)
        nn.init.zeros_(self.conv_offset.weight)
        nn.init.zeros_(self.conv_offset.bias)

    def forward(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """Attend from q to the clip (k, v).

        Args:
            q: (N, 1, C, H, W) query frame.
            k: (N, S, C, H, W) key frames.
            v: (N, S, C, H, W) value frames.

        Returns:
            (N, 1, C, H, W).
        """
        offset = self.conv_offset(torch.cat([q.flatten(1, 2), k.flatten(1, 2)], dim=1))
        parts = kv_parts(self.proj_k(k), self.proj_v(v), self.deformable_groups)
        out = attend(self.proj_q(q)[:, 0], parts, offset, self._params(), None, False).unsqueeze(1)
        return out + self.mlp(out)


class GuidedDeformAttnPack(_DeformAttnGeometry):
    """Flow-guided deformable attention (RVRT), aligning the previous clip's features to the current clip.

    Offsets are ``max_residue_magnitude * tanh(conv_offset(...))`` plus the optical flows; q, k, v are projected
    to 2C channels, attended with :func:`deform_attn`, projected back to C and refined by an MLP. State-dict
    names follow the reference: ``conv_offset.{0,2,4,6,8,10}``, ``proj_q.1``, ``proj_k.1``, ``proj_v.1``,
    ``proj.1``, ``mlp.1.fc1``, ``mlp.1.fc2``; the last offset layer is zero-initialised.

    Args:
        in_channels: feature channels C.
        out_channels: kept for the reference signature (the output has C channels).
        attention_window: (kh, kw).
        deformable_groups: offset groups over the 4C projected kv channels.
        attention_heads: heads over the 2C projected channels.
        clip_size: frames per clip (the offset network's input layout assumes 2).
        max_residue_magnitude: bound of the learned offset residue, in pixels.
        recompute: see :func:`deform_attn`.
        compile: see :func:`deform_attn`.
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int | None = None,
        attention_window: Sequence[int] = (3, 3),
        deformable_groups: int = 12,
        attention_heads: int = 12,
        clip_size: int = 2,
        max_residue_magnitude: float = 10,
        recompute: bool | None = None,
        compile: bool = False,
    ) -> None:
        super().__init__(in_channels, out_channels, attention_window, deformable_groups, attention_heads, clip_size)
        self.max_residue_magnitude = max_residue_magnitude
        self.recompute = recompute
        self.compile = compile
        c = in_channels
        self.proj_channels = 2 * c
        layers: list[nn.Module] = [nn.Conv3d(c * (1 + clip_size) + clip_size * 2, 64, kernel_size=1)]
        for _ in range(4):
            layers += [nn.LeakyReLU(0.1, inplace=True), nn.Conv3d(64, 64, (1, 3, 3), padding=(0, 1, 1))]
        layers += [nn.LeakyReLU(0.1, inplace=True),
                   nn.Conv3d(64, clip_size * deformable_groups * self.attn_size * 2, kernel_size=1)]
        self.conv_offset = nn.Sequential(*layers)
        nn.init.zeros_(self.conv_offset[-1].weight)
        nn.init.zeros_(self.conv_offset[-1].bias)
        self.proj_q = ChannelsLast(nn.Linear(c, self.proj_channels))
        self.proj_k = ChannelsLast(nn.Linear(c, self.proj_channels))
        self.proj_v = ChannelsLast(nn.Linear(c, self.proj_channels))
        self.proj = ChannelsLast(nn.Linear(self.proj_channels, c))
        self.mlp = ChannelsLast(Mlp(c, 2 * c, c))

    def _offset_net(self, inputs: list[Tensor]) -> Tensor:
        """The (1, k, k) Conv3d stack run as 2-D convolutions on all frames: the inputs (B*T, C_i, H, W)
        concatenated along channels -> (B*T, C_out, H, W), contiguous or (without autograd on the CPU) channels-last.

        Without autograd the input is copied once into a channels-last tensor and each convolution runs with its
        LeakyReLU fused (:func:`~models.layers_conv.conv_act`): oneDNN's NCHW kernels ran the 1x1 layers at 40-90
        GFLOP/s against 200 channels-last (benchmarks/RESULTS.md, "Issue 29 on the Intel Xeon again"). In training
        the NCHW stack stays: there channels-last was slower and moved every gradient ("RVRT and BasicVSR++ speed by
        profiling, session 7").
        """
        if eager_no_grad() and inputs[0].device.type == 'cpu':
            x = cat_layout(inputs)
            for conv, act in zip(self.conv_offset[:-1:2], self.conv_offset[1::2]):
                x = conv_act(conv, x, act.negative_slope)
            return frame_conv(x, self.conv_offset[-1])
        x = torch.cat(inputs, dim=1)
        for layer in self.conv_offset:
            x = frame_conv(x, layer) if isinstance(layer, nn.Conv3d) else layer(x)
        return x

    def forward(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        v_prop_warped: Sequence[Tensor],
        flows: Sequence[Tensor],
        return_updateflow: bool,
    ) -> Tensor | tuple[Tensor, Tensor, Tensor]:
        """Align the propagated clip features ``v`` to the current clip.

        Args:
            q: (N, T, C, H, W) current clip features (T = clip_size).
            k: (N, T, C, H, W) previous clip features.
            v: (N, T, C, H, W) propagated features of the previous clip.
            v_prop_warped: two (N, T, C, H, W) flow-warped versions of ``v``.
            flows: two (N, T, 2, H, W) flows (dx, dy), one per offset block.
            return_updateflow: also return the offset-refined flows.

        Returns:
            (N, T, C, H, W) aligned features; with ``return_updateflow`` also the two refined flows
            (N, T, 2, H, W), the mean of each block's offsets in (dx, dy) order (float32, or float64 for
            float64 inputs).
        """
        n, t, _, h, w = q.shape
        raw = self._offset_net([p.flatten(0, 1) for p in (q, *v_prop_warped, *flows)])
        # offsets in fp32 even under autocast: residue (up to 10 px) plus the flow needs sub-pixel precision.
        # Each block's flow, flipped to (dy, dx), is added to its (group, kernel point) pairs: both blocks in one
        # sum, which is already the (N*T, 2*G*kk*2, H, W) offset (no concatenation of the two blocks)
        flow_pair = torch.stack(flows, dim=2).to(work_dtype(raw)).flip(3)  # (N, T, 2, (dy, dx), H, W)
        offset = flow_guided_offsets(raw, flow_pair.view(n * t, 2, 1, 2, h, w), self.max_residue_magnitude)
        qp = self.proj_q(q)
        # deform_attn's kv frames built from the projections: for an even G the keys and the values each copied once
        # into the contiguous frame order the sampling reads (a cat, the frame order and the halves' copies were
        # three copies of all of them)
        keys, values = self.proj_k(k), self.proj_v(v)
        check_shapes(qp.flatten(0, 1), (n, t, 2 * self.proj_channels, h, w), offset, self.kernel_h, self.kernel_w,
                      self.attention_heads, self.deformable_groups, self.clip_size)
        parts = tuple(clip_frames(p, self.clip_size) for p in kv_parts(keys, values, self.deformable_groups))
        out = attend(qp.flatten(0, 1), parts, offset, self._params(), self.recompute, self.compile)
        out = self.proj(out.view(n, t, self.proj_channels, h, w))
        out = out + self.mlp(out)
        if not return_updateflow:
            return out
        flow1, flow2 = (o.mean(2).flip(2) for o in offset.view(n, t, 2, -1, 2, h, w).unbind(2))
        return out, flow1, flow2
