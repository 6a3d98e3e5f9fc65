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

import logging
import math
import os
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from einops.layers.torch import Rearrange
from torch import Tensor, nn

from models.layers_attention import RTMSA, TMSAG, MlpGEGLU, Size3
from models.layers_conv import CPU_HEAP_PIECE_BYTES, FrameConv, Upsample, conv_layout, in_graph
from models.layers_deform_conv import DCNv2PackFlowGuided
from models.layers_linear import Linear
from models.layers_warp import flow_warp, pad
from models.net_io import NetIO
from models.network_spynet import SpyNet

logger = logging.getLogger(__name__)

# Bytes of the upsampling head's largest activation (64 channels at the output resolution) per call without autograd;
# on the CPU a heap-sized piece (:data:`~models.layers_conv.CPU_HEAP_PIECE_BYTES`: tiny forward 1.047x, 67k -> 17k
# page faults; benchmarks/RESULTS.md, "Issue 29 on the Intel Xeon again").
HEAD_CHUNK_BYTES = 256 * 2**20
CPU_HEAD_CHUNK_BYTES = CPU_HEAP_PIECE_BYTES


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
                nn.LayerNorm(4 * in_dim), Linear(4 * in_dim, dim),
            )
        elif reshape == 'up':
            self.reshape = nn.Sequential(
                Rearrange('n d h w (neiw neih c) -> n d (h neih) (w neiw) c', neih=2, neiw=2),
                nn.LayerNorm(in_dim // 4), Linear(in_dim // 4, dim),
            )
        else:
            raise ValueError(f"Stage reshape must be 'none', 'down' or 'up', got {reshape!r}")
        n_mut = int(depth * mul_attn_ratio)
        rates = list(drop_path) if isinstance(drop_path, Sequence) else [drop_path] * depth
        common = {'mlp_ratio': mlp_ratio, 'qkv_bias': qkv_bias, 'qk_scale': qk_scale, 'norm_layer': norm_layer,
                  'use_checkpoint_attn': use_checkpoint_attn, 'use_checkpoint_ffn': use_checkpoint_ffn}
        self.residual_group1 = TMSAG(dim, n_mut, num_heads, (2, window_size[1], window_size[2]), True,
                                     drop_path=rates[:n_mut], **common)
        self.linear1 = Linear(dim, dim)
        # the reference passes the full rate list to both groups, so block j of either group gets rates[j]
        self.residual_group2 = TMSAG(dim, depth - n_mut, num_heads, window_size, False,
                                     drop_path=rates[:depth - n_mut], **common)
        self.linear2 = Linear(dim, dim)
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
        if d == 1:  # a single frame has no neighbours: both directions are all zeros
            zero = x.new_zeros(b, 1, h, w, c)
            return zero, zero
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
            nn.Sequential(nn.Identity(), nn.LayerNorm(embed_dims[6]), Linear(embed_dims[6], embed_dims[7]))
        ])
        for i in range(7, n_stages):
            self.stage8.append(RTMSA(
                embed_dims[i], depths[i], num_heads[i],
                (1, window[1], window[2]) if i in indep_reconsts else window,
                drop_path=dpr[sum(depths[:i]):sum(depths[:i + 1])], use_checkpoint_attn=ckpt_attn[i],
                use_checkpoint_ffn=ckpt_ffn[i], **common,
            ))
        self.norm = norm_layer(embed_dims[-1])
        self.conv_after_body = Linear(embed_dims[-1], embed_dims[0])

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

    @property
    def io(self) -> NetIO:
        """What VRT eats and gives: the noise-level map is read only with parallel warping (``pa_frames > 0``);
        frame interpolation (``pa_frames == 0``) needs exactly its clip of frames, so its tile is the whole clip;
        otherwise 40 frames, the official REDS test setting. In frame interpolation every forward reads exactly
        ``img_size[0]`` frames (``clip_frames``)."""
        noise = self.nonblind_denoising and bool(self.pa_frames)
        vfi = not self.pa_frames
        return NetIO(in_chans=self.in_chans + int(noise), out_chans=self.out_chans, scale=self.upscale,
                     noise_map=noise, frame_interpolation=vfi, input_multiple=self.input_multiple,
                     temporal_tile=0 if vfi else 40, temporal_overlap=0 if vfi else 2,
                     clip_frames=int(self.img_size[0]) if vfi else 0)

    @property
    def input_multiple(self) -> tuple[int, int, int]:
        """``(T, H, W)`` multiples that test-time padding rounds a clip up to: the window (the official test
        script's rule) and, for H and W, also 8 (three 2x downsamplings); both are 8 in the released models."""
        d, h, w = self.window_size
        return d, math.lcm(8, h), math.lcm(8, w)

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
        if d == 1:  # no frame pairs: empty flows, without running SpyNet on an empty batch
            pyramid = [x.new_zeros(0, 2, h // 2**i, w // 2**i) for i in range(4)]
        else:  # both directions in one SpyNet call: backward = spynet(x_t, x_t+1), forward = spynet(x_t+1, x_t)
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
        # the skip added second: the sum takes the first operand's layout, and x is a permuted view of conv_first's
        # (B*D, C, H, W) output, so x first would hand the head NCHW features (oneDNN's convolutions there run
        # 1.3-2x faster channels-last, forward and backward; benchmarks/RESULTS.md, session 5)
        return self.conv_after_body(self.forward_features(x, flows_backward, flows_forward)) + x

    def forward(self, x: Tensor) -> Tensor:
        """Restore a clip.

        Args:
            x: (B, D, C, H, W) in [0, 1]; C = in_chans (+1 noise-level channel for non-blind denoising).
                The sizes the architecture can compute depend on the configuration (see :meth:`check_input`):
                H and W multiples of 8, at least (scale x window) where a stage has mutual attention, above 32
                with parallel warping.

        Returns:
            (B, D, out_chans, upscale * H, upscale * W); frame interpolation returns (B, 1, out_chans, H, W).
        """
        self.check_input(x.shape)
        if not self.pa_frames:
            return self._forward_interpolation(x)
        noise_map = x[:, :, self.in_chans:] if self.nonblind_denoising else None
        x_lq = x[:, :, :self.in_chans]
        flows_backward, flows_forward = self.get_flows(x_lq)
        x_backward, x_forward = self._align_images(x_lq, flows_backward[0], flows_forward[0])
        parts = [x_lq, x_backward, x_forward] + ([noise_map] if noise_map is not None else [])
        feat = self._body(torch.cat(parts, 2), flows_backward, flows_forward)
        b, d, h, w, c = feat.shape
        # (B*D, C, H, W) as a view of the channels-last features (channels_last memory format, no copy): oneDNN's
        # convolutions keep that layout through the head and run 1.3-2x faster on it than on NCHW
        # (benchmarks/RESULTS.md, "Speed by profiling"); conv_layout copies it to NCHW where that trains faster
        feat = conv_layout(feat.reshape(b * d, h, w, c).permute(0, 3, 1, 2))
        if self.upscale == 1:
            out = self.conv_last(feat).contiguous()
            return out.view(b, d, -1, h, w) + x_lq
        out = self._reconstruct(feat)
        out = out.view(b, d, -1, *out.shape[-2:])
        return out + F.interpolate(x_lq, size=out.shape[2:], mode='trilinear', align_corners=False)

    def _reconstruct(self, feat: Tensor) -> Tensor:
        """The upsampling head: (B*D, C0, H, W) -> (B*D, out_chans, sH, sW), contiguous.

        Without autograd the frames go through in groups whose largest activation (64 channels at the output
        resolution) stays within :data:`HEAD_CHUNK_BYTES` (:data:`CPU_HEAD_CHUNK_BYTES` on the CPU): convolutions
        and pixel shuffles work on each frame alone, so the output is the same bits, and a long clip does not hold
        every frame's high-resolution activations at once. Training on the CPU takes one frame at a time (see
        below).
        """
        frames = feat.shape[0]
        step = frames
        if not torch.is_grad_enabled():
            per_frame = 64 * self.upscale**2 * feat.shape[2] * feat.shape[3] * feat.element_size()
            budget = CPU_HEAD_CHUNK_BYTES if feat.device.type == 'cpu' else HEAD_CHUNK_BYTES
            step = max(1, budget // per_frame)
        elif feat.device.type == 'cpu' and not in_graph():
            # training on the CPU: one frame at a time, so the head's activations and backward temporaries (16 MiB a
            # frame at 64 x 64 x 4, x4) stay below glibc's 32 MiB mmap ceiling and reuse heap memory instead of
            # being mapped and faulted in afresh (100 MB each for 6 frames): tiny train step 1.027x; the head's
            # weight gradients are then sums over frames in another order (rounding; benchmarks/RESULTS.md,
            # "VRT speed by profiling, session 6"); a traced graph keeps all frames
            step = 1
        outs = [self.conv_last(self.upsample(self.conv_before_upsample(feat[i:i + step]))).contiguous()
                for i in range(0, frames, step)]
        return outs[0] if len(outs) == 1 else torch.cat(outs, 0)

    def check_input(self, shape: Sequence[int]) -> None:
        """Refuse an input the architecture cannot compute, with one line that says why and what would work.

        The limits follow from the layers, stage by stage (they are exactly the reference implementation's):

        * stages 2-4 each fold 2x2 pixels into channels: H and W must be multiples of 8;
        * mutual attention adds a sine position bias built for the full (2, Wh, Ww) window, so a stage with mutual
          blocks (``int(depth * mul_attn_ratio) > 0``) needs D >= 2 and at least Wh x Ww positions at its scale
          (H / scale >= Wh); stages without them, and stage 8, shrink their windows to any size;
        * SpyNet (pa_frames > 0) needs H and W above 32 (its coarsest level is 1/32 of the size rounded up to 32);
        * flow composition needs 3 frames for pa_frames 4 and 4 for pa_frames 6; frame interpolation fuses
          exactly img_size[0] frames;
        * the deformable convolution of parallel warping splits its K = pa_frames / 2 neighbours' K * C channels
          into K weight groups and ``deformable_groups`` offset groups (and pa_frames 4 halves the offsets).

        Args:
            shape: the input shape (B, D, C, H, W).

        Raises:
            ValueError: naming the input, the failing constraint and the nearest sizes (or settings) that work.
        """
        if len(shape) != 5:
            raise ValueError(f'VRT expects input (B, D, C, H, W), got shape {tuple(shape)}')
        _, d, c, h, w = (int(n) for n in shape)
        what = f'VRT cannot compute an input (B, D, C, H, W) = {tuple(int(n) for n in shape)}'
        expected = self.in_chans + (1 if self.nonblind_denoising and self.pa_frames else 0)
        if c != expected:
            noise = ' (RGB + noise-level map)' if expected != self.in_chans else ''
            raise ValueError(f'{what}: expects {expected} input channels{noise}, got {c}')
        self._check_config()

        stages = [getattr(self, f'stage{i + 1}') for i in range(7)]
        mutual = [(i + 1, scale) for i, (st, scale) in enumerate(zip(stages, (1, 2, 4, 8, 4, 2, 1)))
                  if len(st.residual_group1.blocks)]
        flow_frames = {4: 3, 6: 4}.get(self.pa_frames, 1)  # composed flows reach t+2 / t+3
        min_d = max(2 if mutual else 1, flow_frames)
        if not self.pa_frames and d != self.img_size[0]:
            raise ValueError(f'{what}: frame interpolation fuses the frames along channels (linear_fuse), so it '
                             f'needs D == img_size[0] == {self.img_size[0]} input frames')
        if d < min_d:
            if d < flow_frames:
                why = f'pa_frames {self.pa_frames} composes flows over frames t..t+{self.pa_frames // 2}'
            else:
                why = f'stage {mutual[0][0]} has mutual-attention blocks, which attend pairs of frames'
            raise ValueError(f'{what}: needs at least {min_d} frames ({why}); pad the clip in time')

        wh, ww = self.window_size[1:]
        need_h, need_w, reasons = 8, 8, []
        if h % 8 or w % 8:
            reasons.append('H and W must be multiples of 8 (stages 2-4 each fold 2x2 pixels into channels)')
        if self.pa_frames:
            need_h, need_w = max(need_h, 33), max(need_w, 33)
            if h <= 32 or w <= 32:
                reasons.append("H and W must be above 32 (SpyNet's coarsest pyramid level is 1/32)")
        if mutual:
            stage, scale = max(mutual, key=lambda m: m[1])
            need_h, need_w = max(need_h, scale * wh), max(need_w, scale * ww)
            if h < scale * wh or w < scale * ww:
                reasons.append(
                    f'H and W must be at least {scale * wh}x{scale * ww}: stage {stage} (1/{scale} scale) has '
                    f'mutual-attention blocks, whose sine position bias is fixed to the {wh}x{ww} window'
                )
        if reasons:
            min_h, min_w = -(-need_h // 8) * 8, -(-need_w // 8) * 8
            up_h, up_w = max(min_h, -(-h // 8) * 8), max(min_w, -(-w // 8) * 8)
            raise ValueError(f'{what}: {"; ".join(reasons)}. Nearest working size {up_h}x{up_w}: pad the frames '
                             f'to it, or tile the input with tiles of at least {min_h}x{min_w}')

    def _check_config(self) -> None:
        """Channel counts that no input can run with: the 2x2 unfolding of stages 5-7 and the channel grouping of
        the parallel-warping deformable convolution (torchvision's rules)."""
        unfolded = [getattr(self, f'stage{i}').linear1.out_features for i in (4, 5, 6)]
        if any(c % 4 for c in unfolded):
            raise ValueError(f'VRT cannot run embed_dims[3:6] = {unfolded}: stages 5-7 unfold channels into 2x2 '
                             f'pixels, so these must be divisible by 4')
        if not self.pa_frames:
            return
        pa, k = self.pa_frames, self.pa_frames // 2
        dims = sorted({getattr(self, f'stage{i + 1}').pa_deform.weight.shape[0] for i in range(7)})
        groups = self.stage1.pa_deform.conv_offset[-1].out_channels // 27
        odd = [c for c in dims if c % k]
        if odd:
            raise ValueError(f'VRT cannot run pa_frames={pa}: it aligns {k} neighbours as {k} weight groups, so the '
                             f'channels of stages 1-7 must be divisible by {k}, got {odd}; change embed_dims[:7]')

        def works(g: int) -> bool:
            return all(k * c % g == 0 for c in dims) and (k != 2 or g % 2 == 0)

        if not works(groups):
            near = min((g for g in range(1, k * dims[0] + 1) if works(g)), key=lambda g: (abs(g - groups), g))
            even = ' and be even (pa_frames 4 splits the offsets of each group in two halves)' if k == 2 else ''
            raise ValueError(f'VRT cannot run pa_frames={pa} with deformable_groups={groups}: the offset groups must '
                             f'divide the {k} x C aligned channels (C = {dims}){even}; use deformable_groups={near}')

    def _forward_interpolation(self, x: Tensor) -> Tensor:
        """Frame interpolation (pa_frames == 0): (B, D, C, H, W) with D = img_size[0] -> (B, 1, C_out, H, W)."""
        x_mean = x.mean([1, 3, 4], keepdim=True)
        feat = self._body(x - x_mean, [], [])  # (B, D, H, W, C0)
        b, d, h, w, c = feat.shape
        feat = feat.permute(0, 1, 4, 2, 3).reshape(b, d * c, h, w)  # frames concatenated along channels
        out = F.leaky_relu(self.linear_fuse(feat), 0.2)
        out = self.conv_last(pad(out, (3, 3, 3, 3), mode='reflect'))  # deterministic backward where needed
        return out.view(b, -1, 3, h, w) + x_mean
