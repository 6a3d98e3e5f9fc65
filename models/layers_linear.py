"""``Linear``: ``nn.Linear`` with one oneDNN call on the CPU where no gradient is recorded.

ATen's CPU ``addmm`` first copies the bias into every row of the output and then accumulates the product onto it;
oneDNN's ``linear`` adds the bias as the product is written (``torch.ops.mkldnn._linear_pointwise``, what inductor's
CPU backend calls). On the window attention's shapes (24,576 tokens, 24-36 channels in, 24-108 out) that is
1.3-1.7x faster with the same bits; in a tiny VRT forward the bias copies were 4% of the time
(benchmarks/RESULTS.md, "VRT forward: oneDNN linear"). On AVX2 CPUs 8 output features round otherwise (about 1e-6,
"Training layout on AVX2"). Training, other devices, other dtypes, autocast and recorded
graphs keep ``F.linear`` (hooks run either way: the module's own call is kept).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from models.layers_conv import eager_no_grad


def _fast(module: nn.Linear, x: Tensor) -> bool:
    return (module.bias is not None and x.device.type == 'cpu' and x.dtype == torch.float32
            and module.weight.dtype == torch.float32 and x.dim() >= 2 and eager_no_grad()
            and not torch.is_autocast_enabled('cpu') and torch.backends.mkldnn.enabled
            and torch.backends.mkldnn.is_available())


class Linear(nn.Linear):
    """``nn.Linear`` (same parameters and state-dict names) on oneDNN's fused linear where no gradient is recorded on
    the CPU in float32."""

    def forward(self, x: Tensor) -> Tensor:
        """x: (..., in_features) -> (..., out_features)."""
        if not _fast(self, x):
            return F.linear(x, self.weight, self.bias)
        out = torch.ops.mkldnn._linear_pointwise(x.reshape(-1, x.shape[-1]), self.weight, self.bias, 'none', [], '')
        return out.view(*x.shape[:-1], out.shape[-1])
