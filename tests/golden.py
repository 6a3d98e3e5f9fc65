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


def assert_grads_close(net: nn.Module, grads: dict[str, Tensor], case: str, rel: float = 2e-3) -> None:
    """Each recorded parameter gradient equals ours within ``rel`` of its largest magnitude."""
    params = dict(net.named_parameters())
    for name, grad in grads.items():
        scale = grad.abs().max().clamp_min(1e-12)
        err = (params[name].grad - grad).abs().max() / scale
        assert err < rel, f'{case}: gradient of {name} differs by {err:.2e} (relative to max)'
