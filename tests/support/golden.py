"""Shared by the network tests: the deterministic weight fill and the checks against reference fixtures.

The fixtures (``tests/fixtures/<net>/``) were produced by running the reference implementations in a scratch
directory; they are data (shapes, outputs, gradients), not code.
"""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn


def deterministic_fill(model: nn.Module, seed: int = 0, gain: float = 0.5) -> None:
    """Fill every parameter from a seeded generator, visiting names in sorted order.

    The rule depends only on parameter names and shapes, so the reference and our networks get identical weights
    without storing a state dict: tables std 0.02, matrices/kernels std 1/sqrt(fan_in), 1-D weights
    1 + 0.1 N(0, 1), biases 0.02 N(0, 1).
    """
    gen = torch.Generator().manual_seed(seed)
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name in sorted(params):
            p = params[name]
            noise = torch.randn(p.shape, generator=gen, dtype=torch.float32)
            if name.endswith('relative_position_bias_table'):
                value = 0.02 * noise
            elif p.dim() >= 2:
                value = gain * noise / math.sqrt(p[0].numel())
            elif name.endswith('weight'):
                value = 1.0 + 0.1 * noise
            else:
                value = 0.02 * noise
            p.copy_(value)


def shape_table(fixtures: Path) -> dict[str, Any]:
    """``{config name: {'kwargs', 'shapes', 'buffers', 'num_params'}}`` recorded from the reference."""
    with gzip.open(fixtures / 'state_dict_shapes.json.gz', 'rt') as fh:
        return json.load(fh)


def assert_same_layout(net_cls: type[nn.Module], entry: dict[str, Any]) -> None:
    """The network built (on the meta device) from ``entry['kwargs']`` has the reference's state-dict keys and
    shapes, persistent buffers and parameter count."""
    with torch.device('meta'):
        net = net_cls(**entry['kwargs'])
    sd = net.state_dict()
    assert {k: list(v.shape) for k, v in sd.items()} == entry['shapes']
    assert sorted(k for k, _ in net.named_buffers() if k in sd) == entry['buffers']
    assert sum(p.numel() for p in net.parameters()) == entry['num_params']


def grad_errors(net: nn.Module, grads: dict[str, Tensor]) -> dict[str, float]:
    """Per recorded parameter: the largest difference of ours from its gradient, relative to its largest entry."""
    params = dict(net.named_parameters())
    return {name: float((params[name].grad - grad.to(params[name].grad.device)).abs().max()
                        / grad.abs().max().clamp_min(1e-12)) for name, grad in grads.items()}


def assert_grads_close(net: nn.Module, grads: dict[str, Tensor], case: str, rel: float = 2e-3) -> None:
    """Each recorded parameter gradient equals ours within ``rel`` of its largest magnitude."""
    for name, err in grad_errors(net, grads).items():
        assert err < rel, f'{case}: gradient of {name} differs by {err:.2e} (relative to max)'


# VRT (tests/fixtures/vrt/golden_<case>.pt)
# (output atol, gradient tolerance relative to the largest entry) per golden case: about 2-3x the largest error
# measured against the reference run at one thread (in the comments; AMD EPYC, and where larger, Intel Xeon with
# AVX-512, whose kernels round differently). The gradients of the deformable offset branch and of SpyNet's coarse
# levels amplify fp32 rounding (a sampling point near a pixel boundary moves its bilinear weights' gradient to the
# neighbour), hence their larger errors.
VRT_GOLDEN = {
    'sr_pa2': (2e-7, 2e-3),  # measured 6.0e-8, 1.5e-4 (spynet level 2); Xeon 8.6e-4 (stage1 offset conv)
    'sr_pa4': (2e-7, 1e-3),  # 6.0e-8, 4.6e-4 (stage1 offset conv)
    'sr_pa6': (2e-7, 6e-4),  # 6.0e-8, 2.6e-4 (spynet level 2)
    'deblur': (2e-6, 6e-4),  # 8.3e-7, 2.7e-4 (stage1 offset conv)
    'denoise': (2e-6, 2e-5),  # 6.0e-7, 6.9e-6
    'vfi': (1e-6, 1e-5),  # 2.4e-7, 4.4e-6
    # sizes the reference computes although a stage is below 8 x window (no mutual blocks there, or one frame)
    'small_vfi': (3e-6, 1e-5),  # 2.4e-7, 3.5e-6; AMD EPYC 1.0e-6: 32x32, window 8, no mutual blocks at stage 4
    'small_nomut': (1.5e-6, 2e-4),  # 4.8e-7, 6.9e-5 (spynet level 2): 40x40, no mutual blocks, window 8
    'small_1frame': (4e-7, 1e-5),  # 1.2e-7, 3.3e-6: one frame (mul_attn_ratio 0), x2
}

# RVRT (tests/fixtures/rvrt/golden_<case>.pt)
# (output atol, gradient tolerance relative to the largest entry) per golden case: about 2-3x the largest error
# measured against the reference run at one thread (in the comments; AMD EPYC, and where larger, Intel Xeon with
# AVX-512). In fp64 ours and the reference agree to 1e-15
# on every case, so these gaps are fp32 rounding (largest in the deformable offsets, SpyNet and the bias tables).
RVRT_GOLDEN = {
    'sr': (5e-7, 6e-4),  # measured 1.8e-7, 2.9e-4 (reconstruction bias table)
    'deblur': (4e-7, 5e-3),  # 1.2e-7, 2.0e-4 (spynet level 3); Xeon 1.9e-3 (offset conv, one thread)
    'denoise': (4e-7, 5e-4),  # 1.2e-7, 1.2e-4 (offset conv, spynet); Xeon 1.7e-4
    # one clip of 3 frames at 133x133 (upscale 1): sizes the reference computes that a stricter check refused
    'single_clip': (5e-7, 7e-4),  # 1.8e-7, 3.2e-4 (reconstruction bias table)
}
