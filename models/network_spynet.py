"""SpyNet optical flow and flow-based warping, shared by VRT and RVRT.

State-dict names match the reference (``basic_module.{0..5}.basic_module.{0,2,4,6,8}.*`` plus the
persistent ``mean``/``std`` buffers), so the official ``spynet_sintel_final-3d2a1287.pth`` and the
SpyNet part of every released VRT/RVRT checkpoint load strictly.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from models.layers_conv import Conv2d, add_into, cat_layout, conv_act
from models.layers_warp import flow_warp, pad, resize_bilinear

logger = logging.getLogger(__name__)

SPYNET_URL = 'https://github.com/JingyunLiang/VRT/releases/download/v0.0/spynet_sintel_final-3d2a1287.pth'
SPYNET_SHA256_PREFIX = '3d2a1287'
# Bytes of SpyNet's largest activation (64 channels of the full-resolution level) per call without autograd.
INFERENCE_CHUNK_BYTES = 128 * 2**20


class _BasicModule(nn.Module):
    """One SpyNet pyramid level: five 7x7 convolutions, 8 -> 32 -> 64 -> 32 -> 16 -> 2 channels."""

    def __init__(self) -> None:
        super().__init__()
        chans = (8, 32, 64, 32, 16, 2)
        layers: list[nn.Module] = []
        for i in range(5):
            layers.append(Conv2d(chans[i], chans[i + 1], kernel_size=7, stride=1, padding=3))
            if i < 4:
                layers.append(nn.ReLU(inplace=False))
        self.basic_module = nn.Sequential(*layers)

    def forward(self, x: Tensor) -> Tensor:
        """x: (N, 8, H, W), in :func:`models.layers_conv.conv_layout` -> residual flow (N, 2, H, W), channels-last
        on the CPU (the convolutions 1.2x faster than on NCHW, benchmarks/RESULTS.md "conv-speed")."""
        for conv in self.basic_module[:-1:2]:
            x = conv_act(conv, x)  # ReLU in place on the convolution's output (its backward does not keep it)
        return self.basic_module[-1](x)


class SpyNet(nn.Module):
    """SpyNet (Ranjan & Black, 2017) coarse-to-fine optical flow over a 6-level pyramid.

    Args:
        load_path: file holding ``{'params': state_dict}`` (the official Sintel-final weights). ``None``
            keeps random weights (used when a full VRT/RVRT checkpoint is loaded afterwards). A path that
            does not exist is an error: fetch it with ``scripts/download_spynet.py`` or
            ``utils.utils_download.ensure_file``. Nothing is downloaded here.
        return_levels: pyramid levels to return (5 = full resolution, 4 = 1/2, 3 = 1/4, 2 = 1/8).
    """

    def __init__(self, load_path: str | os.PathLike | None = None, return_levels: Sequence[int] = (5,)) -> None:
        super().__init__()
        bad = [lvl for lvl in return_levels if not 0 <= int(lvl) <= 5]
        if bad or not return_levels:
            raise ValueError(f'SpyNet return_levels must be a non-empty subset of 0..5, got {list(return_levels)}')
        self.return_levels = tuple(int(lvl) for lvl in return_levels)
        self.basic_module = nn.ModuleList([_BasicModule() for _ in range(6)])
        self.register_buffer('mean', torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1))
        self.register_buffer('std', torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1))
        if load_path is not None:
            self.load_pretrained(load_path)

    def load_pretrained(self, load_path: str | os.PathLike) -> None:
        """Load ``{'params': ...}`` weights from a local file (mean/std may be absent from it)."""
        path = os.fspath(load_path)
        if not os.path.isfile(path):
            raise FileNotFoundError(
                f'SpyNet weights not found at {path!r}. Download them once with '
                f'`python scripts/download_spynet.py --out {path}` (or utils.utils_download.ensure_file), '
                f'from {SPYNET_URL}; or set spynet_path to null to start from random SpyNet weights '
                f'(only sensible when a full checkpoint is loaded afterwards).'
            )
        ckpt = torch.load(path, map_location='cpu', weights_only=True)
        if not isinstance(ckpt, dict) or 'params' not in ckpt:
            keys = list(ckpt)[:5] if isinstance(ckpt, dict) else type(ckpt).__name__
            raise KeyError(f"SpyNet file {path!r} has no 'params' entry (found {keys})")
        state = dict(ckpt['params'])
        state.setdefault('mean', self.mean)
        state.setdefault('std', self.std)
        self.load_state_dict(state, strict=True)
        logger.info('Loaded SpyNet weights from %s', path)

    def _process(self, ref: Tensor, supp: Tensor, h: int, w: int) -> list[Tensor]:
        """Coarse-to-fine estimation on inputs already resized to multiples of 32."""
        h_floor, w_floor = ref.shape[2:]
        pair = (torch.cat([ref, supp], 0) - self.mean) / self.std
        pyramid = [pair]
        for _ in range(5):
            pyramid.insert(0, F.avg_pool2d(pyramid[0], kernel_size=2, stride=2, count_include_pad=False))
        n = ref.shape[0]
        coarse = pyramid[0]
        flow = coarse.new_zeros(n, 2, coarse.shape[2] // 2, coarse.shape[3] // 2)
        flows: list[Tensor] = []
        for level, level_pair in enumerate(pyramid):
            ref_l, supp_l = level_pair[:n], level_pair[n:]
            # resizing and padding of the flows through layers_warp: deterministic backward where needed
            up = resize_bilinear(flow, scale_factor=2, align_corners=True) * 2.0
            if up.shape[2] != ref_l.shape[2]:
                up = pad(up, [0, 0, 0, 1], mode='replicate')
            if up.shape[3] != ref_l.shape[3]:
                up = pad(up, [0, 1, 0, 0], mode='replicate')
            warped = flow_warp(supp_l, up.permute(0, 2, 3, 1), interp_mode='bilinear', padding_mode='border')
            # the sum into ``up`` (contiguous, not needed after) where no gradient is recorded; the same bits
            flow = add_into(up, self.basic_module[level](cat_layout([ref_l, warped, up], 1)))
            if level in self.return_levels:
                scale = 2 ** (5 - level)
                out = resize_bilinear(flow, size=(h // scale, w // scale), align_corners=False)
                factor = out.new_tensor(
                    [float(w // scale) / float(w_floor // scale), float(h // scale) / float(h_floor // scale)]
                )
                flows.insert(0, out * factor.view(1, 2, 1, 1))
        return flows

    def forward(self, ref: Tensor, supp: Tensor) -> Tensor | list[Tensor]:
        """Estimate the flow that warps ``supp`` onto ``ref``.

        Args:
            ref: (N, 3, H, W) RGB in [0, 1]; H and W must exceed 32 (the coarsest level is 1/32).
            supp: (N, 3, H, W) RGB in [0, 1].

        Returns:
            (N, 2, H, W) flow when one level is requested; otherwise a list, finest first, whose entry for
            level ``l`` has shape (N, 2, H // 2**(5-l), W // 2**(5-l)).
        """
        if ref.shape != supp.shape:
            raise ValueError(f'SpyNet ref and supp shapes differ: {tuple(ref.shape)} vs {tuple(supp.shape)}')
        h, w = ref.shape[2:]
        if h <= 32 or w <= 32:
            raise ValueError(f'SpyNet needs H and W above 32 pixels, got {h}x{w}')
        h_floor = math.ceil(h / 32.0) * 32
        w_floor = math.ceil(w / 32.0) * 32
        # without autograd, frame pairs go through in groups whose largest activation (64 channels at the full
        # level) stays within INFERENCE_CHUNK_BYTES: every op works on each pair alone, so the flows are the same
        # bits, and a long high-resolution clip does not hold every pair's activations at once
        step = ref.shape[0]
        if not torch.is_grad_enabled():
            step = max(1, INFERENCE_CHUNK_BYTES // (64 * h_floor * w_floor * ref.element_size()))
        parts = []
        for i in range(0, max(ref.shape[0], 1), step):
            # plain F.interpolate: input frames never require grad, and the forward kernel is deterministic
            r, s = (F.interpolate(t[i:i + step], size=(h_floor, w_floor), mode='bilinear', align_corners=False)
                    for t in (ref, supp))
            parts.append(self._process(r, s, h, w))
        flows = parts[0] if len(parts) == 1 else [torch.cat(level, 0) for level in zip(*parts)]
        return flows[0] if len(flows) == 1 else flows


def neighbour_flows(spynet: SpyNet, lqs: Tensor, mirrored: bool = False, store: torch.device | None = None,
                    chunk: int = 0) -> tuple[Tensor, Tensor]:
    """Flows between neighbouring frames of clips for recurrent propagation (BasicVSR++-style networks, IART).

    Float64 clips are estimated in float64, every other dtype in float32 (the caller turns autocast off: flows need
    sub-pixel precision).

    Args:
        spynet: a single-level :class:`SpyNet` (``return_levels=(5,)``).
        lqs: (N, T, 3, H, W) frames.
        mirrored: the clip is mirror-extended (frame i == frame T-1-i): the forward flows are the flipped backward
            flows, so only one direction is estimated.
        store: where the flows are kept (default: ``lqs.device``).
        chunk: frame pairs per SpyNet call (0: all at once).

    Returns:
        ``(flows_forward, flows_backward)``, each (N, T-1, 2, H, W): backward[i] warps frame i+1 onto frame i,
        forward[i] frame i onto frame i+1.
    """
    n, t, c, h, w = lqs.shape
    store = store or lqs.device
    work = torch.float64 if lqs.dtype == torch.float64 else torch.float32
    first = lqs[:, :-1].reshape(-1, c, h, w).to(work)
    second = lqs[:, 1:].reshape(-1, c, h, w).to(work)
    ref, supp = (first, second) if mirrored else (torch.cat([first, second]), torch.cat([second, first]))
    step = chunk or max(1, ref.shape[0])
    parts = [spynet(ref[i:i + step], supp[i:i + step]).to(store) for i in range(0, ref.shape[0], step)]
    flows = torch.cat(parts) if parts else ref.new_zeros(0, 2, h, w, device=store)
    if mirrored:
        backward = flows.view(n, t - 1, 2, h, w)
        return backward.flip(1), backward
    backward, forward = flows.view(2, n, t - 1, 2, h, w).unbind(0)
    return forward, backward
