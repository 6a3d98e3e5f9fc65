"""layers_linear.Linear: oneDNN's fused linear where no gradient is recorded on the CPU, the same bits as nn.Linear."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from models.layers_linear import Linear


class _Ops(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.names: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(str(func.overloadpacket))
        return func(*args, **(kwargs or {}))


def _pair(cin: int, cout: int, bias: bool = True) -> tuple[Linear, torch.nn.Linear]:
    torch.manual_seed(0)
    fast = Linear(cin, cout, bias=bias)
    plain = torch.nn.Linear(cin, cout, bias=bias)
    plain.load_state_dict(fast.state_dict())
    return fast, plain


@pytest.mark.parametrize('shape', [(3, 8, 24), (24576, 36), (2, 5, 7, 108)])
def test_no_grad_forward_is_one_fused_call_with_nn_linears_bits(shape) -> None:
    """The window attention's shapes (qkv 24 -> 72, MLP 36 -> 108 -> 36) and a 4-D input: one oneDNN call, no
    bias copy, output bit-identical to nn.Linear's."""
    fast, plain = _pair(shape[-1], 3 * shape[-1] if shape[-1] < 100 else 36)
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        with _Ops() as ops:
            out = fast(x)
        ref = plain(x)
    calls = [n for n in ops.names if n not in ('aten.view', 'aten._unsafe_view')]
    assert calls == ['mkldnn._linear_pointwise'], ops.names  # no addmm, no bias copy
    assert out.shape == ref.shape and torch.equal(out, ref)


def test_training_autocast_float64_and_no_bias_keep_the_plain_op() -> None:
    """Gradients recorded, CPU autocast, float64 and a linear without bias run F.linear (the same results)."""
    fast, plain = _pair(24, 72)
    x = torch.randn(10, 24, requires_grad=True)
    with _Ops() as ops:
        out = fast(x)
    assert 'aten.addmm' in ops.names and torch.equal(out, plain(x))
    out.sum().backward()
    assert fast.weight.grad is not None
    with torch.no_grad(), torch.autocast('cpu', dtype=torch.bfloat16), _Ops() as ops:
        fast(x)
    assert 'mkldnn._linear_pointwise' not in ops.names
    with torch.no_grad(), _Ops() as ops:
        fast.double()(x.double())
    assert 'mkldnn._linear_pointwise' not in ops.names
    nobias, _ = _pair(24, 72, bias=False)
    with torch.no_grad(), _Ops() as ops:
        nobias(x)
    assert 'mkldnn._linear_pointwise' not in ops.names
