"""The CPU fast path of models/layers_conv.py: where no gradient is recorded, oneDNN's fused convolution + activation
and convolution + residual sum give the separate ops' bits (and are really taken), and training, autocast, float64,
tracers and forward hooks keep the plain ops."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from models import layers_conv as lc
from models.layers_conv import Conv2d, FrameConv, Upsample, conv_act, conv_add_, frame_conv
from models.select_network import define_network, network_kwargs
from tests.support.golden import assert_grads_close, grad_errors
from tests.support.networks import tiny_net

FUSED = {'mkldnn::_convolution_pointwise', 'mkldnn::_convolution_pointwise_'}


class _Ops(TorchDispatchMode):
    """Names of the operators that reach the dispatcher."""

    def __init__(self) -> None:
        super().__init__()
        self.names: set[str] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.add(func.overloadpacket._qualified_op_name)
        return func(*args, **(kwargs or {}))


class _Act(nn.Module):
    def __init__(self, conv: nn.Module) -> None:
        super().__init__()
        self.conv = conv

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return conv_act(self.conv, x, 0.1)


def _convs() -> dict[str, nn.Module]:
    """A stride-2 dilated Conv2d, a VRT FrameConv and a plain Conv3d with a (1, 3, 3) kernel (RVRT's), seeded."""
    torch.manual_seed(0)
    return {'conv2d': Conv2d(6, 8, 3, stride=2, padding=2, dilation=2),
            'frameconv': FrameConv(6, 8),
            'conv3d': nn.Conv3d(6, 8, (1, 3, 3), padding=(0, 1, 1))}


def _plain(conv: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The convolution as ``F.conv2d`` on the parameter itself."""
    w = conv.weight.squeeze(2) if conv.weight.dim() == 5 else conv.weight
    return F.conv2d(x, w, conv.bias, stride=conv.stride[-2:], padding=conv.padding[-2:], dilation=conv.dilation[-2:])


@pytest.mark.parametrize('kind', ['conv2d', 'frameconv', 'conv3d'])
def test_fused_steps_give_the_separate_ops_bits_and_follow_weight_changes(kind: str) -> None:
    conv = _convs()[kind]
    x = torch.randn(2, 6, 13, 11).contiguous(memory_format=torch.channels_last)
    with torch.no_grad():
        for step in range(2):
            if step:  # an optimizer step writes the parameter in place: the cached copy must follow
                conv.weight.mul_(-1.5)
            plain = _plain(conv, x)
            residual = torch.randn_like(plain).contiguous(memory_format=torch.channels_last)
            expected_sum = residual + plain
            with _Ops() as ops:
                relu, leaky = conv_act(conv, x), conv_act(conv, x, 0.1)
                total = conv_add_(conv, x, residual)
            assert FUSED <= ops.names, ops.names
            assert torch.equal(relu, F.relu(plain)) and torch.equal(leaky, F.leaky_relu(plain, 0.1))
            assert torch.equal(total, expected_sum) and total.data_ptr() == residual.data_ptr()
            assert torch.equal(frame_conv(x, conv) if kind != 'conv2d' else conv(x), plain)


# the ONNX exporter still traces with torch.jit.trace, which torch now marks deprecated
@pytest.mark.filterwarnings('ignore:`torch.jit.trace:FutureWarning')
def test_training_autocast_float64_tracing_and_hooks_keep_the_plain_ops() -> None:
    conv = _convs()['frameconv']
    x = torch.randn(2, 6, 9, 7).contiguous(memory_format=torch.channels_last)
    residual = torch.randn(2, 8, 9, 7)
    # with gradients: a new tensor, the residual untouched, gradients through both
    xg, rg = x.clone().requires_grad_(), residual.clone().requires_grad_()
    with _Ops() as ops:
        out = conv_add_(conv, xg, rg) + conv_act(conv, xg, 0.1)
    assert not FUSED & ops.names and torch.equal(rg.detach(), residual)
    out.sum().backward()
    assert xg.grad is not None and torch.equal(rg.grad, torch.ones_like(residual))
    with torch.no_grad():
        with torch.autocast('cpu', dtype=torch.bfloat16), _Ops() as ops:  # bf16 rounding between the steps, as plain
            got = conv_act(conv, x, 0.1)
            want = F.leaky_relu(frame_conv(x, conv), 0.1)
        assert not FUSED & ops.names and got.dtype == torch.bfloat16 and torch.equal(got, want)
        conv64 = _convs()['frameconv'].double()
        with _Ops() as ops:
            conv_act(conv64, x.double(), 0.1)
        assert not FUSED & ops.names
        traced = torch.jit.trace(_Act(conv), x)  # the ONNX exporter's tracer
        seen = []  # a forward hook on the convolution (a feature tap) still sees its call
        conv2d = _convs()['conv2d']
        conv2d.register_forward_hook(lambda m, args, out: seen.append(out))
        with _Ops() as ops:
            got = conv_act(conv2d, x, 0.1)
        assert not FUSED & ops.names and len(seen) == 1 and torch.equal(got, seen[0])
    assert 'mkldnn' not in str(traced.graph) and 'leaky_relu' in str(traced.graph)


def _plain_upsample(up: Upsample, x: torch.Tensor) -> torch.Tensor:
    """The upsampler as separate plain ops: convolution, leaky ReLU, pixel shuffle, then the last convolution."""
    for i, f in enumerate(up.factors):
        x = F.pixel_shuffle(F.leaky_relu(_plain(up.get_submodule(str(5 * i)), x), 0.1), f)
    return _plain(up.get_submodule(str(5 * len(up.factors))), x)


@pytest.mark.parametrize('scale', [4, 3])
def test_upsample_keeps_one_shuffle_buffer_without_autograd_and_releases_it(scale: int) -> None:
    """Without autograd the pixel shuffles write into one kept buffer (the same one on the next call, a prefix of it
    for fewer frames): the plain ops' bits; ``train()`` and a call that records gradients (of any Upsample, e.g.
    the training network's while the EMA copy holds one) release it."""
    torch.manual_seed(0)
    up, other = Upsample(scale, 8).eval(), Upsample(scale, 8).eval()
    x = torch.randn(3, 8, 5, 6).contiguous(memory_format=torch.channels_last)
    with torch.no_grad():
        first = up(x)
        buf = up.__dict__['_shuffle_buffer']
        assert buf.numel() == 3 * 8 * (5 * scale) * (6 * scale)
        assert torch.equal(first, _plain_upsample(up, x))
        again, fewer = up(x), up(x[:2])
        assert up.__dict__['_shuffle_buffer'] is buf  # reused, not allocated anew
        assert torch.equal(again, first) and torch.equal(fewer, first[:2])
        other(x)
    up.train()
    assert '_shuffle_buffer' not in up.__dict__ and '_shuffle_buffer' in other.__dict__
    up(x.clone().requires_grad_()).sum().backward()  # a training call releases the EMA-like copy's buffer too
    assert '_shuffle_buffer' not in other.__dict__


def test_conv_layout_trains_in_nchw_where_that_is_faster(monkeypatch) -> None:
    """conv_layout: channels-last without gradients; with gradients NCHW where nchw_trains_faster (AVX2 CPUs), else
    channels-last; float64 untouched."""
    x = torch.rand(2, 8, 6, 5)
    for faster in (True, False):
        monkeypatch.setattr(lc, 'nchw_trains_faster', lambda faster=faster: faster)
        with torch.no_grad():
            assert lc.conv_layout(x).is_contiguous(memory_format=torch.channels_last)
        trained = lc.conv_layout(x.contiguous(memory_format=torch.channels_last))
        assert trained.is_contiguous() is faster
        assert trained.is_contiguous(memory_format=torch.channels_last) is not faster
        assert lc.conv_layout(x.double()).stride() == x.stride()
        assert torch.equal(trained, x)


class _ConvLayouts(TorchDispatchMode):
    """(input width, NCHW-contiguous) of every convolution that reaches the dispatcher."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[int, bool]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten.convolution.default:
            self.seen.append((args[0].shape[-1], args[0].is_contiguous()))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize('net_type', ['vrt', 'rvrt', 'basicvsrpp'])
def test_both_training_layouts_give_the_same_gradients(net_type: str, monkeypatch) -> None:
    """A tiny network trained in NCHW (nchw_trains_faster) and in channels-last: the same loss and parameter gradients
    to rounding, and the head's convolutions (those at the output width) really get each layout."""
    torch.manual_seed(0)
    net = define_network(net_type, network_kwargs(tiny_net(net_type))).train()
    x = torch.rand(1, 3, 3, 40, 40)
    results = []
    for faster in (True, False):
        monkeypatch.setattr(lc, 'nchw_trains_faster', lambda faster=faster: faster)
        net.zero_grad()
        torch.manual_seed(1)
        with _ConvLayouts() as spy:
            loss = net(x).square().mean()
        loss.backward()
        results.append((loss.detach(), {n: p.grad.clone() for n, p in net.named_parameters() if p.grad is not None}))
        widest = max(w for w, _ in spy.seen)
        head = [nchw for w, nchw in spy.seen if w == widest]
        assert head and all(nchw is faster for nchw in head), (faster, spy.seen)
    (loss_a, grads_a), (loss_b, grads_b) = results
    torch.testing.assert_close(loss_a, loss_b, rtol=1e-5, atol=0)
    assert grads_a.keys() == grads_b.keys() and grads_a
    errors = grad_errors(net, grads_a)  # net holds the channels-last run's gradients
    print(net_type, 'largest gradient differences, relative to each tensor\'s largest entry:',
          sorted(errors.items(), key=lambda kv: -kv[1])[:3])
    # the goldens' tolerance: fp32 rounding, amplified in the offset branches and SpyNet (tests/support/golden.py)
    # measured (VRT, the worst tensor): 1.4e-3 on an AMD EPYC with AVX2 (Zen 3), 6.1e-3 on one with AVX-512 (Zen 4;
    # stage5.pa_deform.bias): the sampling offsets amplify rounding; RVRT 7.0e-5 / 1.8e-6, BasicVSR++ 7.1e-6 / 5.4e-6
    assert_grads_close(net, grads_a, net_type, rel=1.5e-2 if net_type == 'vrt' else 5e-4)
