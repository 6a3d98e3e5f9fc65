"""VRT network tests (golden fixtures made with the reference implementation, see tests/fixtures/vrt/README.md)."""

from __future__ import annotations

import math

import torch
from torch import nn


def deterministic_fill(model: nn.Module, seed: int = 0, gain: float = 0.5) -> None:
    """Fill every parameter from a seeded generator, visiting names in sorted order.

    The rule depends only on parameter names and shapes, so the reference and our VRT get identical weights
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
