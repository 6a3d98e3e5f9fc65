"""RVRT: Recurrent Video Restoration Transformer with guided deformable attention (Liang et al., 2022).

Constructor arguments, defaults, module names, parameter shapes and persistent buffers follow the reference
implementation, so the released ``{'params': ...}`` checkpoints (tasks 001-006) and KAIR's option files load
with ``strict=True``. Differences from the reference, none of which changes the fp32 numerics:

* guided deformable attention runs in pure PyTorch (:mod:`models.layers_deform_attn`): no CUDA build, CPU and
  GPU, autocast-safe;
* the mirror-extension test is done per forward (the reference sets a flag once and never resets it, so every
  later input reused backward flows), with ``torch.equal`` instead of a norm;
* long videos (``t > cpu_cache_length``) cache features on the CPU and compute on the input's device (the
  reference hard-codes ``.cuda()``); on a CPU input there is nothing to cache;
* the Swin blocks are VRT's (channels-last, ``scaled_dot_product_attention``, cached shift masks), the
  (1, 3, 3) convolutions run as 2-D convolutions over all frames, both SpyNet directions run in one call,
  and the flow compositions of a branch are computed for all clips at once;
* activation checkpointing is non-reentrant.

Input (N, T, C, H, W) in [0, 1] RGB, C = 3 (4 with the noise-level map for non-blind denoising); output
(N, T, 3, 4H, 4W) for x4 super-resolution, (N, T, 3, H, W) for deblurring and denoising (``upscale=1``).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from timm.layers import Mlp
from torch import Tensor, nn

from models.layers_attention import RTMSA
from models.layers_conv import Upsample, conv_act, conv_layout, frame_conv, in_graph
from models.layers_guided_deform_attn import GuidedDeformAttnPack
from models.layers_warp import flow_warp
from models.net_io import NetIO
from models.network_spynet import SpyNet

logger = logging.getLogger(__name__)

BRANCHES = ('backward_1', 'forward_1', 'backward_2', 'forward_2')


class RSTB(RTMSA):
    """Residual Swin Transformer block: ``x + linear(STG(x))``, channels-last (B, D, H, W, C).

    VRT's :class:`~models.layers_attention.RTMSA` (self-attention only) built with RVRT's plain GELU MLP
    (``mlp.fc1``/``mlp.fc2``) and zero-initialised relative position tables, as in the reference.

    Args:
        dim, depth, num_heads, window_size, mlp_ratio: see :class:`~models.layers_attention.RTMSA`.
        **kwargs: ``qkv_bias``, ``qk_scale``, ``norm_layer``, ``use_checkpoint_attn``, ``use_checkpoint_ffn``.
    """

    def __init__(self, dim: int, depth: int, num_heads: int, window_size: Sequence[int], mlp_ratio: float = 2.0,
                 **kwargs: Any) -> None:
        super().__init__(dim, depth, num_heads, window_size, mlp_ratio, mlp_layer=Mlp, bias_table_std=0.0, **kwargs)


class RSTBWithInputConv(nn.Module):
    """A grouped (1, 3, 3) convolution, LayerNorm, ``num_blocks`` RSTBs, LayerNorm.

    Sub-modules sit at the indices of the reference's ``main`` Sequential (``main.1`` conv, ``main.3`` norm,
    ``main.5.<i>`` blocks, ``main.7`` norm).

    Args:
        in_channels: input channels.
        dim: output channels.
        groups: groups of the input convolution.
        num_blocks: RSTBs.
        *rstb_args, **rstb_kwargs: the remaining arguments of :class:`RSTB` after ``dim`` (``depth``,
            ``num_heads``, ``window_size``, ``mlp_ratio``, ``qkv_bias``, ``qk_scale``, ``norm_layer``,
            ``use_checkpoint_attn``, ``use_checkpoint_ffn``).
    """

    def __init__(self, in_channels: int, dim: int, groups: int, num_blocks: int, *rstb_args: Any,
                 **rstb_kwargs: Any) -> None:
        super().__init__()
        blocks = [RSTB(dim, *rstb_args, **rstb_kwargs) for _ in range(num_blocks)]
        self.main = nn.ModuleDict({
            '1': nn.Conv3d(in_channels, dim, kernel_size=(1, 3, 3), padding=(0, 1, 1), groups=groups),
            '3': nn.LayerNorm(dim),
            '5': nn.Sequential(*blocks),
            '7': nn.LayerNorm(dim),
        })

    def forward(self, x: Tensor) -> Tensor:
        """x: (N, T, C_in, H, W) -> (N, T, dim, H, W)."""
        n, t = x.shape[:2]
        y = frame_conv(x.flatten(0, 1), self.main['1'])
        y = y.view(n, t, *y.shape[1:]).permute(0, 1, 3, 4, 2)  # (N, T, H, W, dim)
        y = self.main['7'](self.main['5'](self.main['3'](y)))
        return y.permute(0, 1, 4, 2, 3)


class StridedFeatExtract(nn.Module):
    """Shallow features at 1/4 resolution (deblurring, denoising): two stride-2 (1, 3, 3) convs + LReLU, then
    :class:`RSTBWithInputConv` (reference indices ``1``, ``3`` and ``6``)."""

    def __init__(self, in_channels: int, dim: int, rstb: RSTBWithInputConv) -> None:
        super().__init__()
        self.add_module('1', nn.Conv3d(in_channels, dim, (1, 3, 3), (1, 2, 2), (0, 1, 1)))
        self.add_module('3', nn.Conv3d(dim, dim, (1, 3, 3), (1, 2, 2), (0, 1, 1)))
        self.add_module('6', rstb)

    def forward(self, x: Tensor) -> Tensor:
        """x: (N, T, C_in, H, W) -> (N, T, dim, H/4, W/4)."""
        n, t = x.shape[:2]
        y = F.leaky_relu(frame_conv(x.flatten(0, 1), getattr(self, '1')), 0.1)
        y = F.leaky_relu(frame_conv(y, getattr(self, '3')), 0.1)
        return getattr(self, '6')(y.view(n, t, *y.shape[1:]))


class RVRT(nn.Module):
    """Recurrent Video Restoration Transformer.

    Args:
        upscale: 4 for video super-resolution; 1 for deblurring/denoising (features at 1/4 resolution).
        clip_size: frames per clip; the flow composition of the reference is defined for 2 only.
        img_size: stored only (reference signature).
        window_size: (Wd, Wh, Ww) of the propagation RSTBs; feature extraction and reconstruction use
            (1, Wh, Ww).
        num_blocks: RSTBs in feature extraction, each propagation backbone and reconstruction.
        depths: Swin layers per RSTB of those three parts.
        embed_dims: channels of those three parts (the first two must be equal).
        num_heads: attention heads of those three parts.
        mlp_ratio, qkv_bias, qk_scale, norm_layer: Swin block settings.
        inputconv_groups: groups of the six input convolutions (feature extraction, four backbones,
            reconstruction).
        spynet_path: SpyNet weights (``{'params': ...}``); ``None`` keeps random weights. A missing file is an
            error; nothing is downloaded.
        max_residue_magnitude: bound of the learned offset residue in guided deformable attention.
        deformable_groups: offset groups of guided deformable attention.
        attention_heads: heads of guided deformable attention.
        attention_window: (kh, kw) sampling window of guided deformable attention.
        nonblind_denoising: input carries a noise-level map as a fourth channel.
        use_checkpoint_attn, use_checkpoint_ffn: activation checkpointing in the four propagation backbones.
        no_checkpoint_attn_blocks, no_checkpoint_ffn_blocks: backbone indices (0-3) exempt from checkpointing.
        cpu_cache_length: longer inputs keep their features on the CPU (GPU inputs only).
        deform_attn_compile: run the deformable-attention core through ``torch.compile``.
    """

    def __init__(
        self,
        upscale: int = 4,
        clip_size: int = 2,
        img_size: Sequence[int] = (2, 64, 64),
        window_size: Sequence[int] = (2, 8, 8),
        num_blocks: Sequence[int] = (1, 2, 1),
        depths: Sequence[int] = (2, 2, 2),
        embed_dims: Sequence[int] = (144, 144, 144),
        num_heads: Sequence[int] = (6, 6, 6),
        mlp_ratio: float = 2.0,
        qkv_bias: bool = True,
        qk_scale: float | None = None,
        norm_layer: type[nn.Module] = nn.LayerNorm,
        inputconv_groups: Sequence[int] = (1, 1, 1, 1, 1, 1),
        spynet_path: str | None = None,
        max_residue_magnitude: float = 10,
        deformable_groups: int = 12,
        attention_heads: int = 12,
        attention_window: Sequence[int] = (3, 3),
        nonblind_denoising: bool = False,
        use_checkpoint_attn: bool = False,
        use_checkpoint_ffn: bool = False,
        no_checkpoint_attn_blocks: Sequence[int] = (),
        no_checkpoint_ffn_blocks: Sequence[int] = (),
        cpu_cache_length: int = 100,
        deform_attn_compile: bool = False,
    ) -> None:
        super().__init__()
        if upscale not in (1, 4):
            raise ValueError(f'RVRT upscale must be 4 (super-resolution) or 1 (deblurring/denoising), got {upscale}')
        if clip_size != 2:
            raise ValueError(f'RVRT clip_size must be 2 (its flow composition is defined for 2), got {clip_size}')
        if embed_dims[0] != embed_dims[1]:
            raise ValueError(f'RVRT embed_dims[0] and embed_dims[1] must be equal, got {list(embed_dims)}')
        if len(inputconv_groups) != 6:
            raise ValueError(f'RVRT inputconv_groups needs 6 entries, got {list(inputconv_groups)}')
        self.upscale = upscale
        self.clip_size = clip_size
        self.img_size = tuple(img_size)
        self.window_size = tuple(window_size)
        self.nonblind_denoising = nonblind_denoising
        self.in_chans = 4 if nonblind_denoising else 3
        self.cpu_cache_length = cpu_cache_length
        ckpt_attn = [use_checkpoint_attn and i not in no_checkpoint_attn_blocks for i in range(4)]
        ckpt_ffn = [use_checkpoint_ffn and i not in no_checkpoint_ffn_blocks for i in range(4)]
        common = dict(mlp_ratio=mlp_ratio, qkv_bias=qkv_bias, qk_scale=qk_scale, norm_layer=norm_layer)
        c = embed_dims[0]
        spatial_window = (1, window_size[1], window_size[2])

        self.spynet = SpyNet(spynet_path, return_levels=(5,))
        extract = RSTBWithInputConv(c if upscale != 4 else 3, c, inputconv_groups[0], num_blocks[0], depths[0],
                                    num_heads[0], spatial_window, **common)
        self.feat_extract = extract if upscale == 4 else StridedFeatExtract(self.in_chans, c, extract)

        self.backbone = nn.ModuleDict()
        self.deform_align = nn.ModuleDict()
        for i, name in enumerate(BRANCHES):
            self.deform_align[name] = GuidedDeformAttnPack(
                embed_dims[1], embed_dims[1], attention_window=attention_window, attention_heads=attention_heads,
                deformable_groups=deformable_groups, clip_size=clip_size,
                max_residue_magnitude=max_residue_magnitude, compile=deform_attn_compile)
            self.backbone[name] = RSTBWithInputConv(
                (2 + i) * c, embed_dims[1], inputconv_groups[i + 1], num_blocks[1], depths[1], num_heads[1],
                window_size, use_checkpoint_attn=ckpt_attn[i], use_checkpoint_ffn=ckpt_ffn[i], **common)

        self.reconstruction = RSTBWithInputConv(5 * c, embed_dims[2], inputconv_groups[5], num_blocks[2], depths[2],
                                                num_heads[2], spatial_window, **common)
        self.conv_before_upsampler = nn.Sequential(nn.Conv3d(embed_dims[-1], 64, kernel_size=1),
                                                   nn.LeakyReLU(0.1, inplace=True))
        self.upsampler = Upsample(4, 64)
        self.conv_last = nn.Conv3d(64, 3, kernel_size=(1, 3, 3), padding=(0, 1, 1))

    # ------------------------------------------------------------------------------------------------------
    # flows
    # ------------------------------------------------------------------------------------------------------
    @property
    def io(self) -> NetIO:
        """What RVRT eats and gives; its recurrent propagation wants long temporal tiles (the official 100)."""
        return NetIO(in_chans=self.in_chans, out_chans=3, scale=self.upscale, noise_map=self.nonblind_denoising,
                     input_multiple=self.input_multiple, temporal_tile=100, temporal_overlap=2)

    @property
    def input_multiple(self) -> tuple[int, int, int]:
        """``(T, H, W)`` multiples that test-time padding rounds a clip up to: the window (the official rule) and,
        without upscaling (features at 1/4 resolution), H and W also to 4."""
        d, h, w = self.window_size
        return (d, h, w) if self.upscale == 4 else (d, math.lcm(4, h), math.lcm(4, w))

    @staticmethod
    def is_mirror_extended(lqs: Tensor) -> bool:
        """True when frame i equals frame t-1-i for every i (t even), e.g. Vimeo's 7 -> 14 mirrored input."""
        t = lqs.shape[1]
        return t % 2 == 0 and torch.equal(lqs[:, : t // 2], lqs[:, t // 2:].flip(1))

    def compute_flow(self, lqs: Tensor, mirrored: bool = False) -> tuple[Tensor, Tensor]:
        """SpyNet flows between neighbouring frames.

        Args:
            lqs: (N, T, 3, h, w).
            mirrored: the sequence is mirror-extended, so forward flows are the flipped backward flows.

        Returns:
            ``(flows_forward, flows_backward)``, each (N, T-1, 2, h, w): backward[i] warps frame i+1 onto
            frame i, forward[i] warps frame i onto frame i+1.
        """
        n, t, c, h, w = lqs.shape
        first = lqs[:, :-1].reshape(-1, c, h, w)
        second = lqs[:, 1:].reshape(-1, c, h, w)
        if mirrored:
            backward = self.spynet(first, second).view(n, t - 1, 2, h, w)
            return backward.flip(1), backward
        both = self.spynet(torch.cat([first, second]), torch.cat([second, first]))
        backward, forward = both.view(2, n, t - 1, 2, h, w).unbind(0)
        return forward, backward

    @staticmethod
    def _compose_flows(flows: Tensor, backward: bool, num_clips: int) -> list[tuple[Tensor, Tensor]]:
        """Flows from each clip to the previous one in propagation order (clip size 2), for clips 1.. at once.

        In propagation order, frames 0, 1 are the previous clip and 2, 3 the current one. Returns per step
        ``(flow_n1, flow_n2)``, each (N, 2, 2, h, w): ``flow_n1 = [2<-0, 3<-1]`` and ``flow_n2 = [2<-1, 3<-0]``.
        """
        if num_clips < 2:
            return []
        t = flows.shape[1] + 1
        steps = range(1, num_clips)
        if backward:
            idx01, idx12, idx23 = ([t - 2 * i - k for i in steps] for k in (0, 1, 2))
        else:
            idx01, idx12, idx23 = ([2 * i - 2 + k for i in steps] for k in (0, 1, 2))
        n, _, _, h, w = flows.shape
        f01, f12, f23 = (flows[:, idx].flatten(0, 1) for idx in (idx01, idx12, idx23))

        def compose(a: Tensor, b: Tensor) -> Tensor:  # b + a warped by b
            return b + flow_warp(a, b.permute(0, 2, 3, 1))

        f02 = compose(f01, f12)
        f13 = compose(f12, f23)
        f03 = compose(f02, f23)
        flow_n1 = torch.stack([f02, f13], 1).view(n, len(steps), 2, 2, h, w)
        flow_n2 = torch.stack([f12, f03], 1).view(n, len(steps), 2, 2, h, w)
        return [(flow_n1[:, s], flow_n2[:, s]) for s in range(len(steps))]

    # ------------------------------------------------------------------------------------------------------
    # propagation and reconstruction
    # ------------------------------------------------------------------------------------------------------
    def propagate(
        self,
        feats: dict[str, list[Tensor]],
        flows: Tensor,
        branch: int,
        updated_flows: dict[str, list[tuple[Tensor, Tensor]]],
        device: torch.device,
    ) -> list[Tensor]:
        """One propagation branch over all clips.

        Args:
            feats: per-clip features of the earlier branches (``'shallow'`` first), each (N, 2, C, h, w).
            flows: (N, T-1, 2, h, w) flows of this branch's direction.
            branch: index into :data:`BRANCHES`.
            updated_flows: offset-refined flows per direction, written by ``*_1`` and read by ``*_2``.
            device: where to compute (features may be cached elsewhere).

        Returns:
            Per-clip features of this branch, in time order, each (N, 2, C, h, w) on the features' device.
        """
        name = BRANCHES[branch]
        direction, iteration = name.split('_')
        backward = direction == 'backward'
        keys = ['shallow', *BRANCHES[:branch]]
        num_clips = len(feats['shallow'])
        order = list(range(num_clips))[::-1] if backward else list(range(num_clips))
        if iteration == '1':
            guide = self._compose_flows(flows, backward, num_clips)
            updated_flows[direction] = []
        else:
            guide = updated_flows[direction]

        def clip_feat(key: str, idx: int) -> Tensor:
            f = feats[key][idx].to(device)
            return f.flip(1) if backward else f

        store = feats['shallow'][0].device
        feat_prop = torch.zeros_like(feats['shallow'][0], device=device)
        outputs = []
        for i, idx in enumerate(order):
            if i > 0:
                flow_n1, flow_n2 = (f.to(device) for f in guide[i - 1])
                n, clip, c, h, w = feat_prop.shape
                pair = torch.cat([feat_prop, feat_prop.flip(1)]).flatten(0, 1)
                pair_flow = torch.cat([flow_n1, flow_n2]).permute(0, 1, 3, 4, 2).flatten(0, 1)
                warped1, warped2 = flow_warp(pair, pair_flow).view(2, n, clip, c, h, w).unbind(0)
                args = (clip_feat(keys[-1], idx), clip_feat(keys[-1], order[i - 1]), feat_prop, [warped1, warped2],
                        [flow_n1, flow_n2])
                if iteration == '1':
                    feat_prop, new1, new2 = self.deform_align[name](*args, True)
                    updated_flows[direction].append((new1, new2))
                else:
                    feat_prop = self.deform_align[name](*args, False)
            inputs = [clip_feat(k, idx) for k in keys] + [feat_prop]
            feat_prop = feat_prop + self.backbone[name](torch.cat(inputs, dim=2))
            outputs.append(feat_prop.to(store))
        if backward:
            outputs = [f.flip(1) for f in outputs[::-1]]
        return outputs

    def _head(self, feats: Tensor, lqs: Tensor) -> Tensor:
        """Reconstruction + upsampling + skip: feats (N, T, 5C, h, w), lqs (N, T, 3, H, W) -> (N, T, 3, 4h, 4w)."""
        n, t = feats.shape[:2]
        x = conv_layout(self.reconstruction(feats).flatten(0, 1))
        x = conv_act(self.conv_before_upsampler[0], x, 0.1)
        if not in_graph() and x.device.type == 'cpu':  # a traced graph keeps all frames
            # one frame at a time through the upsampler: its activations (64 channels at 4x, 16 MiB a 64 x 64 frame)
            # stay under glibc's 32 MiB mmap ceiling, so freed memory is reused instead of fresh pages faulted in.
            # Without autograd the same bits; in training the weight gradients sum the frames in another order
            # (benchmarks/RESULTS.md, "RVRT speed by profiling, session 6": train step 1.04x, 115k -> 38k faults)
            x = torch.cat([frame_conv(self.upsampler(f), self.conv_last) for f in x.split(1)])
        else:
            x = frame_conv(self.upsampler(x), self.conv_last)
        skip = lqs.flatten(0, 1)
        if skip.shape[-2:] != x.shape[-2:]:
            skip = F.interpolate(skip, size=x.shape[-2:], mode='bilinear', align_corners=False)
        return (x + skip).view(n, t, *x.shape[1:])

    def _check_input(self, lqs: Tensor) -> None:
        """Refuse, in one line, an input the architecture cannot compute (exactly the reference's limits).

        * T frames make ``T // clip_size`` clips: T must be a multiple of clip_size, or below 2 * clip_size (then
          one clip holds all T frames and no alignment runs);
        * SpyNet needs its input above 32 px: the LQ frames for x4, their 1/4 bicubic downsample for upscale 1;
        * upscale 1 aligns features of ceil(H / 4) rows with flows of H // 4 rows: H and W must be multiples of 4
          once there is more than one clip. A single clip of other sizes computes, with (4 * ceil(H / 4),
          4 * ceil(W / 4)) output frames, as in the reference.
        """
        if lqs.dim() != 5:
            raise ValueError(f'RVRT expects (N, T, C, H, W) input, got shape {tuple(lqs.shape)}')
        _, t, c, h, w = lqs.shape
        if c != self.in_chans:
            what = 'RGB + noise-level map' if self.nonblind_denoising else 'RGB'
            raise ValueError(f'RVRT expects {self.in_chans} input channels ({what}), got {c}')
        clip = self.clip_size
        if t < clip or (t % clip and t >= 2 * clip):
            near = sorted({max(clip, t // clip * clip), -(-t // clip) * clip})
            raise ValueError(f'RVRT processes clips of clip_size={clip} frames: T must be a multiple of {clip} (or '
                             f'{clip}..{2 * clip - 1} frames as one clip), got {t}; use {" or ".join(map(str, near))}')
        if self.upscale == 4 and min(h, w) <= 32:
            raise ValueError(f'RVRT (x4) needs LQ frames larger than 32x32 for SpyNet, got {h}x{w}; pad to at least '
                             f'{max(h, 33)}x{max(w, 33)}')
        if self.upscale != 4 and (min(h, w) < 132 or (t >= 2 * clip and (h % 4 or w % 4))):
            up_h, up_w = max(132, -(-h // 4) * 4), max(132, -(-w // 4) * 4)
            raise ValueError(f'RVRT (upscale 1) computes flows at 1/4 resolution: H and W must be at least 132 (SpyNet '
                             f'needs the 1/4 frames above 32) and multiples of 4 (features and flows of one size), '
                             f'got {h}x{w}; pad to {up_h}x{up_w}')

    def forward(self, lqs: Tensor) -> Tensor:
        """Restore a video.

        Args:
            lqs: (N, T, C, H, W) in [0, 1]; C = 3, or 4 for non-blind denoising (RGB + noise-level map);
                T divisible by clip_size (or one clip of fewer than 2 * clip_size frames); see ``_check_input``.

        Returns:
            (N, T, 3, 4H, 4W) for upscale 4, (N, T, 3, H, W) for upscale 1; on the CPU when the features were
            cached there (T > cpu_cache_length on a GPU), as in the reference.
        """
        self._check_input(lqs)
        n, t, _, h, w = lqs.shape
        device = lqs.device
        cache = t > self.cpu_cache_length and device.type != 'cpu'
        store = torch.device('cpu') if cache else device
        if self.upscale == 4:
            lqs_flow = lqs
        else:
            lqs_flow = F.interpolate(lqs[:, :, :3].reshape(-1, 3, h, w), scale_factor=0.25, mode='bicubic')
            lqs_flow = lqs_flow.view(n, t, 3, h // 4, w // 4)
        mirrored = self.is_mirror_extended(lqs)

        num_clips = t // self.clip_size
        if cache:
            shallow = [self.feat_extract(clip).to(store) for clip in torch.chunk(lqs, num_clips, dim=1)]
        else:
            shallow = list(torch.chunk(self.feat_extract(lqs), num_clips, dim=1))
        flows_forward, flows_backward = self.compute_flow(lqs_flow, mirrored)
        if cache:
            flows_forward, flows_backward = flows_forward.to(store), flows_backward.to(store)

        feats: dict[str, list[Tensor]] = {'shallow': shallow}
        updated_flows: dict[str, list[tuple[Tensor, Tensor]]] = {}
        for branch, name in enumerate(BRANCHES):
            flows = flows_backward if name.startswith('backward') else flows_forward
            feats[name] = self.propagate(feats, flows, branch, updated_flows, device)

        rgb = lqs[:, :, :3]
        all_feats = torch.cat([torch.cat(feats[k], dim=1) for k in ('shallow', *BRANCHES)], dim=2)
        if not cache:
            return self._head(all_feats, rgb)
        outputs = [self._head(all_feats[:, i:i + 1].to(device), rgb[:, i:i + 1]).to(store) for i in range(t)]
        return torch.cat(outputs, dim=1)
