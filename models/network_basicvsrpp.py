"""BasicVSR++: second-order grid propagation with flow-guided deformable alignment (Chan et al., CVPR 2022).

Constructor arguments, defaults and state-dict names follow BasicSR's port (``basicsr/archs/basicvsrpp_arch.py``),
so BasicSR-format weights load with ``strict=True``; the released mmediting/mmagic checkpoints load through
:func:`models.basicvsrpp_keymap.from_mmagic` (the network's ``adapt_state_dict``). Differences from the reference,
none of which changes the fp32 numerics:

* the second-order deformable alignment runs on every device (BasicSR skips it without CUDA): torchvision's
  ``deform_conv2d``, or on the CPU and in deterministic mode the sampled formulation of
  :func:`models.layers_deform_conv.deform_conv3x3_sampled`; offsets, masks and the convolution stay fp32 under
  autocast, and SpyNet runs in fp32 with autocast off (flows need sub-pixel precision);
* the mirror-extension test is done per forward (BasicSR sets its flag once and never resets it);
* both SpyNet directions run in one call, and feature extraction and reconstruction run over many frames at once
  (in chunks of about :data:`HEAD_PIXELS` LQ pixels, so long high-resolution clips do not hold every frame's
  high-resolution activations at once);
* long clips (``T > cpu_cache_length``) on a non-CPU device keep features and flows on the CPU and compute on the
  input's device, SpyNet included (the reference computes every flow of the clip on the device at once); the output
  comes back on the input's device (the reference leaves it on the CPU);
* inputs the reference would assert on but can compute (LQ frames between 33 and 63 pixels) are accepted; inputs
  it cannot compute are refused in one line (:meth:`BasicVSRPlusPlus.check_input`).

Input (N, T, 3, H, W) RGB in [0, 1]; output (N, T, 3, 4H, 4W) with ``is_low_res_input`` (x4 super-resolution),
else (N, T, 3, H, W) (deblurring, decompression: features at 1/4 resolution).
"""

from __future__ import annotations

import logging
import math
import os

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from models.basicvsrpp_keymap import from_mmagic
from models.layers_conv import Conv2d, add_into, cat_layout, conv_act, conv_add_, conv_layout, eager_no_grad, in_graph
from models.layers_deform_conv import flow_guided_offsets, modulated_deform_conv3x3
from models.layers_warp import autocast_off, flow_warp
from models.net_io import NetIO
from models.network_spynet import SpyNet

logger = logging.getLogger(__name__)

BRANCHES = ('backward_1', 'forward_1', 'backward_2', 'forward_2')
DEFORM_GROUPS = 16  # fixed in the reference
HEAD_PIXELS = 64 * 64 * 16  # LQ pixels per chunk of feature extraction / reconstruction (16 frames of 64x64)


class ResidualBlockNoBN(nn.Module):
    """``x + conv2(relu(conv1(x)))``, 3x3 convolutions; initialised as BasicSR (Kaiming normal x 0.1, zero bias).

    Args:
        num_feat: channels.
    """

    def __init__(self, num_feat: int) -> None:
        super().__init__()
        self.conv1 = Conv2d(num_feat, num_feat, 3, 1, 1)
        self.conv2 = Conv2d(num_feat, num_feat, 3, 1, 1)
        for conv in (self.conv1, self.conv2):
            nn.init.kaiming_normal_(conv.weight)
            conv.weight.data.mul_(0.1)
            nn.init.zeros_(conv.bias)

    def forward(self, x: Tensor) -> Tensor:
        """x: (N, C, H, W) -> (N, C, H, W)."""
        return x + self.conv2(F.relu(self.conv1(x), inplace=True))  # in place: the convolution keeps no output


class ConvResidualBlocks(nn.Module):
    """A 3x3 convolution, LeakyReLU(0.1) and ``num_block`` residual blocks (``main.0``, ``main.2.<i>``).

    Args:
        num_in_ch: input channels.
        num_out_ch: output channels.
        num_block: residual blocks.
    """

    def __init__(self, num_in_ch: int, num_out_ch: int, num_block: int) -> None:
        super().__init__()
        self.main = nn.Sequential(
            Conv2d(num_in_ch, num_out_ch, 3, 1, 1), nn.LeakyReLU(negative_slope=0.1, inplace=True),
            nn.Sequential(*[ResidualBlockNoBN(num_out_ch) for _ in range(num_block)]))

    def forward(self, x: Tensor) -> Tensor:
        """x: (N, C_in, H, W) -> (N, C_out, H, W), in :func:`conv_layout`."""
        first, _, blocks = self.main
        x = conv_act(first, conv_layout(x), 0.1)
        for block in blocks:  # x + conv2(relu(conv1(x))), into x (this module's own) where no gradient is recorded
            x = conv_add_(block.conv2, conv_act(block.conv1, x), x)
        return x


class SecondOrderDeformableAlignment(nn.Module):
    """Flow-guided modulated deformable 3x3 convolution over the two previous propagated features.

    Parameters ``weight`` (C, 2C, 3, 3) and ``bias`` (C,) are the deformable convolution's (BasicSR's
    ``ModulatedDeformConvPack`` layout); ``conv_offset`` predicts, from ``[cond_n1, current, cond_n2, flow_1,
    flow_2]``, offset residues (bounded by ``max_residue_magnitude``) around each flow and sigmoid masks for
    :data:`DEFORM_GROUPS` offset groups.

    Args:
        channels: feature channels C (divisible by 8: 2C input channels over 16 offset groups).
        max_residue_magnitude: bound of the offset residue (Eq. 6 of the paper).
    """

    def __init__(self, channels: int, max_residue_magnitude: float = 10) -> None:
        super().__init__()
        c = channels
        self.max_residue_magnitude = max_residue_magnitude
        self.weight = nn.Parameter(torch.empty(c, 2 * c, 3, 3))
        self.bias = nn.Parameter(torch.zeros(c))
        self.conv_offset = nn.Sequential(
            Conv2d(3 * c + 4, c, 3, 1, 1), nn.LeakyReLU(negative_slope=0.1, inplace=True),
            Conv2d(c, c, 3, 1, 1), nn.LeakyReLU(negative_slope=0.1, inplace=True),
            Conv2d(c, c, 3, 1, 1), nn.LeakyReLU(negative_slope=0.1, inplace=True),
            Conv2d(c, 27 * DEFORM_GROUPS, 3, 1, 1))
        # 'auto': the sampled formulation on the CPU (faster than torchvision's CPU kernel, backward especially)
        # and in deterministic mode while autograd records; torchvision's kernel elsewhere
        self.impl = 'auto'
        stdv = 1.0 / math.sqrt(2 * c * 9)
        nn.init.uniform_(self.weight, -stdv, stdv)
        nn.init.zeros_(self.conv_offset[-1].weight)
        nn.init.zeros_(self.conv_offset[-1].bias)

    def forward(self, x: Tensor, extra_feat: Tensor, flow_1: Tensor, flow_2: Tensor) -> Tensor:
        """Align ``x`` = [previous feature, feature two steps back] to the current frame.

        Args:
            x: (N, 2C, H, W).
            extra_feat: (N, 3C, H, W) ``[cond_n1, current, cond_n2]`` (the previous features flow-warped), or
                the list of the three (N, C, H, W) (concatenated with the flows in one copy).
            flow_1: (N, 2, H, W) flow (dx, dy) to the previous frame; flow_2 to the frame two steps back.

        Returns:
            (N, C, H, W), float32 (float64 for float64 inputs) whatever the autocast state.
        """
        pieces = list(extra_feat) if isinstance(extra_feat, (list, tuple)) else [extra_feat]
        dtype = pieces[0].dtype
        out = cat_layout(pieces + [flow_1.to(dtype), flow_2.to(dtype)])
        for conv in self.conv_offset[:-1:2]:
            out = conv_act(conv, out, 0.1)
        out = self.conv_offset[-1](out)
        third = out.shape[1] // 3  # offsets (dy, dx) of the two halves, then the mask logits
        # offsets, masks and the convolution in fp32 even under autocast: residue (up to 10 px) plus the flow needs
        # sub-pixel precision that bf16 does not have
        work = torch.float64 if out.dtype == torch.float64 else torch.float32
        n, _, h, w = out.shape
        # each flow, flipped to (dy, dx), is added to every (group, kernel point) pair of its half of the offsets
        flows = torch.stack([flow_1, flow_2], dim=1).to(work).flip(2).view(n, 2, 1, 2, h, w)
        offset = flow_guided_offsets(out[:, :2 * third], flows, self.max_residue_magnitude)
        mask = out[:, 2 * third:].contiguous()
        return modulated_deform_conv3x3(x, offset, mask, self.weight, self.bias, self.impl, type(self).__name__)


class BasicVSRPlusPlus(nn.Module):
    """BasicVSR++ (x4 super-resolution, or same-size restoration).

    Args:
        mid_channels: feature channels (a multiple of 8, for the 16 offset groups of the alignment).
        num_blocks: residual blocks of each propagation branch.
        max_residue_magnitude: bound of the offset residue around the flow (Eq. 6 of the paper).
        is_low_res_input: True: x4 super-resolution; False: output of the input's size (deblurring,
            decompression), features and flows at 1/4 resolution.
        spynet_path: SpyNet weights (``{'params': ...}``, BasicSR's layout); ``None`` keeps random weights. A
            missing file is an error; nothing is downloaded.
        cpu_cache_length: longer clips on a non-CPU device keep their features and flows on the CPU, in
            training too, as in the reference (the moves are differentiable).
    """

    def __init__(self, mid_channels: int = 64, num_blocks: int = 7, max_residue_magnitude: float = 10,
                 is_low_res_input: bool = True, spynet_path: str | os.PathLike | None = None,
                 cpu_cache_length: int = 100) -> None:
        super().__init__()
        if mid_channels % 8:
            raise ValueError(f'BasicVSRPlusPlus mid_channels must be a multiple of 8 (2 * mid_channels input '
                             f'channels over {DEFORM_GROUPS} offset groups), got {mid_channels}')
        self.mid_channels = mid_channels
        self.is_low_res_input = is_low_res_input
        self.cpu_cache_length = cpu_cache_length
        # tests only: cache mode on any device, the CPU included, where the moves to and from the CPU are no-ops but
        # every other step of the mode runs (chunked SpyNet, per-step moves, features kept in lists on the "store")
        self._force_cpu_cache = False
        c = mid_channels

        self.spynet = SpyNet(spynet_path, return_levels=(5,))
        if is_low_res_input:
            self.feat_extract = ConvResidualBlocks(3, c, 5)
        else:
            self.feat_extract = nn.Sequential(
                Conv2d(3, c, 3, 2, 1), nn.LeakyReLU(negative_slope=0.1, inplace=True),
                Conv2d(c, c, 3, 2, 1), nn.LeakyReLU(negative_slope=0.1, inplace=True),
                ConvResidualBlocks(c, c, 5))
        self.deform_align = nn.ModuleDict()
        self.backbone = nn.ModuleDict()
        for i, name in enumerate(BRANCHES):
            self.deform_align[name] = SecondOrderDeformableAlignment(c, max_residue_magnitude)
            self.backbone[name] = ConvResidualBlocks((2 + i) * c, c, num_blocks)
        self.reconstruction = ConvResidualBlocks(5 * c, c, 5)
        self.upconv1 = Conv2d(c, c * 4, 3, 1, 1)
        self.upconv2 = Conv2d(c, 64 * 4, 3, 1, 1)
        self.pixel_shuffle = nn.PixelShuffle(2)
        self.conv_hr = Conv2d(64, 64, 3, 1, 1)
        self.conv_last = Conv2d(64, 3, 3, 1, 1)
        self.img_upsample = nn.Upsample(scale_factor=4, mode='bilinear', align_corners=False)

    @property
    def io(self) -> NetIO:
        """What BasicVSR++ eats and gives. Temporal tiles of 100 frames (the official evaluation runs REDS4's
        100-frame clips whole, and mmagic's ``cpu_cache_length`` is 100): a recurrent network gets better the
        more frames it sees; 10 frames of overlap give the frames next to a cut context from both tiles."""
        return NetIO(in_chans=3, out_chans=3, scale=4 if self.is_low_res_input else 1,
                     input_multiple=(1, 1, 1) if self.is_low_res_input else (1, 4, 4),
                     temporal_tile=100, temporal_overlap=10)

    @staticmethod
    def adapt_state_dict(state_dict: dict[str, Tensor]) -> dict[str, Tensor]:
        """Translate a released mmediting/mmagic state dict to ours (BasicSR-format dicts pass unchanged)."""
        return from_mmagic(state_dict)

    @staticmethod
    def is_mirror_extended(lqs: Tensor) -> bool:
        """True when frame i equals frame t-1-i for every i (t even), e.g. Vimeo's 7 -> 14 mirrored input."""
        t = lqs.shape[1]
        return t % 2 == 0 and torch.equal(lqs[:, : t // 2], lqs[:, t // 2:].flip(1))

    def check_input(self, lqs: Tensor) -> None:
        """Refuse, in one line, an input the network cannot compute.

        SpyNet needs frames above 32 pixels (the LQ frames for x4, their 1/4 bicubic downsample otherwise; the
        reference asserts 64 although it computes from 33), and without ``is_low_res_input`` the features of
        ``ceil(H / 4)`` rows meet flows of ``H // 4`` rows and an output of ``4 * ceil(H / 4)`` rows meets the
        input: H and W must be multiples of 4.
        """
        if lqs.dim() != 5:
            raise ValueError(f'BasicVSRPlusPlus expects (N, T, C, H, W) input, got shape {tuple(lqs.shape)}')
        _, t, c, h, w = lqs.shape
        if c != 3:
            raise ValueError(f'BasicVSRPlusPlus expects 3 input channels (RGB), got {c}')
        if t < 1:
            raise ValueError('BasicVSRPlusPlus needs at least one frame, got 0')
        if self.is_low_res_input and min(h, w) <= 32:
            raise ValueError(f'BasicVSRPlusPlus (x4) needs LQ frames larger than 32x32 for SpyNet, got {h}x{w}; pad '
                             f'to at least {max(h, 33)}x{max(w, 33)}')
        if not self.is_low_res_input and (min(h, w) < 132 or h % 4 or w % 4):
            up_h, up_w = max(132, -(-h // 4) * 4), max(132, -(-w // 4) * 4)
            raise ValueError(f'BasicVSRPlusPlus (is_low_res_input false) computes at 1/4 resolution: H and W must be '
                             f'multiples of 4 and at least 132 (SpyNet needs the 1/4 frames above 32), got {h}x{w}; '
                             f'pad to {up_h}x{up_w}')

    # ----------------------------------------------------------------------------------------------- flows
    def compute_flow(self, lqs: Tensor, mirrored: bool = False, store: torch.device | None = None,
                     chunk: int = 0) -> tuple[Tensor, Tensor]:
        """SpyNet flows between neighbouring frames, in fp32 (autocast off).

        Args:
            lqs: (N, T, 3, h, w) frames SpyNet sees.
            mirrored: the clip is mirror-extended: forward flows are the flipped backward flows.
            store: where the flows are kept (default: ``lqs.device``).
            chunk: frame pairs per SpyNet call (0: all at once).

        Returns:
            ``(flows_forward, flows_backward)``, each (N, T-1, 2, h, w): backward[i] warps frame i+1 onto frame i,
            forward[i] warps frame i onto frame i+1.
        """
        n, t, c, h, w = lqs.shape
        store = store or lqs.device
        first = lqs[:, :-1].reshape(-1, c, h, w).float()
        second = lqs[:, 1:].reshape(-1, c, h, w).float()
        ref, supp = (first, second) if mirrored else (torch.cat([first, second]), torch.cat([second, first]))
        step = chunk or max(1, ref.shape[0])
        with autocast_off(lqs.device):
            flows = torch.cat([self.spynet(ref[i:i + step], supp[i:i + step]).to(store)
                               for i in range(0, ref.shape[0], step)]) if ref.shape[0] else ref.new_zeros(0, 2, h, w)
        if mirrored:
            backward = flows.view(n, t - 1, 2, h, w)
            return backward.flip(1), backward
        backward, forward = flows.view(2, n, t - 1, 2, h, w).unbind(0)
        return forward, backward

    # ----------------------------------------------------------------------------------------------- propagation
    def propagate(self, feats: dict[str, list[Tensor]], flows: Tensor, name: str, device: torch.device) -> list[Tensor]:
        """One propagation branch with second-order grid propagation.

        Args:
            feats: per-frame features of the earlier branches (``'spatial'`` first), each (N, C, h, w).
            flows: (N, T-1, 2, h, w) flows of this branch's direction.
            name: one of :data:`BRANCHES`.
            device: where to compute (features and flows may be cached elsewhere).

        Returns:
            This branch's per-frame features in time order, each (N, C, h, w), kept where the features are.
        """
        t = len(feats['spatial'])
        backward = name.startswith('backward')
        order = range(t - 1, -1, -1) if backward else range(t)
        store = feats['spatial'][0].device
        earlier = [k for k in feats if k != 'spatial']
        outputs: list[Tensor] = []
        feat_prop = feats['spatial'][0].new_zeros(feats['spatial'][0].shape, device=device)
        prev_flow = None
        for i, idx in enumerate(order):
            feat_current = feats['spatial'][idx].to(device)
            if i > 0:
                # flow from the previous frame in propagation order onto this one
                flow_n1 = flows[:, idx if backward else idx - 1].to(device)
                cond_n1 = flow_warp(feat_prop, flow_n1.permute(0, 2, 3, 1))
                if i > 1:
                    feat_n2 = outputs[-2].to(device)
                    flow_n2 = flow_n1 + flow_warp(prev_flow, flow_n1.permute(0, 2, 3, 1))
                    cond_n2 = flow_warp(feat_n2, flow_n2.permute(0, 2, 3, 1))
                else:
                    feat_n2, flow_n2, cond_n2 = (torch.zeros_like(v) for v in (feat_prop, flow_n1, cond_n1))
                prev_flow = flow_n1
                cond = [cond_n1, feat_current, cond_n2.to(cond_n1.dtype)]  # concatenated with the flows in one copy
                pair = [feat_prop, feat_n2.to(feat_prop.dtype)]
                if eager_no_grad() and device.type == 'cpu':
                    # straight into the contiguous (NCHW) tensor the deformable convolution samples from: one copy of
                    # the channels-last features, not a cat and then its NCHW copy (0.96 -> 0.53 ms a step, same bits)
                    n_, c_, h_, w_ = feat_prop.shape
                    feat_prop = torch.cat(pair, dim=1, out=feat_prop.new_empty(n_, 2 * c_, h_, w_))
                else:
                    feat_prop = torch.cat(pair, dim=1)
                feat_prop = self.deform_align[name](feat_prop, cond, flow_n1, flow_n2)
            inputs = [feat_current] + [feats[k][idx].to(device) for k in earlier] + [feat_prop]
            dtype = torch.promote_types(feat_current.dtype, feat_prop.dtype)
            # the residual first: the sum takes its layout (channels-last, see conv_layout), not feat_prop's
            feat_prop = add_into(self.backbone[name](cat_layout([f.to(dtype) for f in inputs])), feat_prop)
            outputs.append(feat_prop if store == device else feat_prop.to(store))
        return outputs[::-1] if backward else outputs

    # ----------------------------------------------------------------------------------------------- head
    @staticmethod
    def _head_frame_by_frame(device: torch.device, cache: bool) -> bool:
        """Whether the head takes one frame at a time: on the CPU, in eager mode (a traced graph keeps the frames
        together), and not in cache mode (whose chunks are for a GPU)."""
        return device.type == 'cpu' and not cache and not in_graph()

    def _head(self, feats: Tensor, lqs: Tensor) -> Tensor:
        """Reconstruction + x4 pixel-shuffle upsampling + skip: (M, 5C, h, w), (M, 3, H, W) -> (M, 3, H', W')."""
        x = self.reconstruction(feats)
        # LeakyReLU in place on each convolution's output (which its backward does not keep), before the pixel
        # shuffle (a permutation: the same values as after it); one large activation less each
        x = self.pixel_shuffle(conv_act(self.upconv1, x, 0.1))
        x = self.pixel_shuffle(conv_act(self.upconv2, x, 0.1))
        x = self.conv_last(conv_act(self.conv_hr, x, 0.1))
        skip = self.img_upsample(lqs) if self.is_low_res_input else lqs
        return skip.to(x.dtype) + x  # the skip first: the sum takes its (contiguous) layout

    def forward(self, lqs: Tensor) -> Tensor:
        """Restore a clip.

        Args:
            lqs: (N, T, 3, H, W) RGB in [0, 1]; see :meth:`check_input` for the sizes.

        Returns:
            (N, T, 3, 4H, 4W) with ``is_low_res_input``, else (N, T, 3, H, W), on the input's device: with the
            features cached on the CPU (T > cpu_cache_length on a non-CPU device) the output chunks wait there and
            come back in one copy (the reference returns them on the CPU, where a training loss meets its GT on the
            GPU).
        """
        self.check_input(lqs)
        n, t, c, h, w = lqs.shape
        device = lqs.device
        # as mmagic (``t > cpu_cache_length and lqs.is_cuda``) and BasicSR, in training too: the moves are
        # differentiable, so gradients flow back through the cached features to the device
        cache = t > self.cpu_cache_length and (device.type != 'cpu' or self._force_cpu_cache)
        store = torch.device('cpu') if cache else device
        if self.is_low_res_input:
            lqs_flow = lqs
        else:
            lqs_flow = F.interpolate(lqs.reshape(-1, c, h, w), scale_factor=0.25, mode='bicubic')
            lqs_flow = lqs_flow.view(n, t, c, h // 4, w // 4)
        frames = max(1, HEAD_PIXELS // (lqs_flow.shape[-2] * lqs_flow.shape[-1]))
        chunks = [(s, min(s + frames, t)) for s in range(0, t, frames)]

        spatial: list[Tensor] = []
        for s, e in chunks:
            feat = self.feat_extract(lqs[:, s:e].reshape(-1, c, h, w))
            feat = feat.view(n, e - s, *feat.shape[1:])
            spatial += [f.to(store) for f in feat.unbind(1)]
        flows_forward, flows_backward = self.compute_flow(lqs_flow, self.is_mirror_extended(lqs), store,
                                                          chunk=frames if cache else 0)

        feats: dict[str, list[Tensor]] = {'spatial': spatial}
        for name in BRANCHES:
            flows = flows_backward if name.startswith('backward') else flows_forward
            feats[name] = self.propagate(feats, flows, name, device)

        outputs = []
        for s, e in chunks:
            if not self._head_frame_by_frame(device, cache):
                hr = torch.cat([torch.stack([feats[k][i] for i in range(s, e)], 1).to(device) for k in feats], dim=2)
                out = self._head(hr.flatten(0, 1), lqs[:, s:e].flatten(0, 1))
                out = out.view(n, e - s, *out.shape[1:])
            else:
                # one frame at a time, its features copied once into the head's input: the head's activations
                # (64 channels at 4x) then stay small enough for the allocator to reuse freed memory instead of
                # faulting in fresh pages on each call (without autograd the head 1.15x faster, same bits; in training
                # 1.17x the whole step, the weight gradients summed over frames in another order: benchmarks/RESULTS.md,
                # "Training layout on AVX2")
                out = torch.stack([self._head(cat_layout([feats[k][i] for k in feats]), lqs[:, i])
                                   for i in range(s, e)], 1)
            outputs.append(out.to(store))
        return torch.cat(outputs, dim=1).to(device)
