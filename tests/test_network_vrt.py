"""VRT network tests (golden fixtures made with the reference implementation, see tests/fixtures/vrt/README.md)."""

from __future__ import annotations

import gzip
import json
import math
import re
from pathlib import Path

import pytest
import torch
import torchvision
from torch import nn

from models.network_vrt import VRT, DCNv2PackFlowGuided, deform_conv3x3_sampled


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


FIXTURES = Path(__file__).parent / 'fixtures' / 'vrt'


@pytest.fixture(autouse=True, scope='module')
def _one_thread():
    """Many small kernels: one intra-op thread avoids OpenMP spin-wait stalls on a shared CI machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


GOLDEN = ['sr_pa2', 'sr_pa4', 'sr_pa6', 'deblur', 'denoise', 'vfi']
TINY = {
    'depths': (2,) * 7 + (2, 1), 'embed_dims': (16,) * 7 + (24, 24), 'num_heads': (2,) * 9,
    'indep_reconsts': (8,), 'window_size': (2, 4, 4), 'drop_path_rate': 0.0, 'deformable_groups': 4,
}


def _tiny(**kwargs) -> VRT:
    torch.manual_seed(0)
    return VRT(**{**TINY, 'img_size': (3, 40, 40), **kwargs})


@pytest.mark.parametrize('case', GOLDEN)
def test_golden_matches_reference(case: str) -> None:
    """Same weights and input as the reference run -> same output (1e-4) and parameter gradients."""
    data = torch.load(FIXTURES / f'golden_{case}.pt', weights_only=True)
    net = VRT(**data['config']).eval()
    deterministic_fill(net, data['fill_seed'])
    out = net(data['input'])
    assert out.shape == data['output'].shape
    torch.testing.assert_close(out, data['output'], atol=1e-4, rtol=1e-4)
    out.square().mean().backward()
    params = dict(net.named_parameters())
    assert data['grads']
    for name, grad in data['grads'].items():
        scale = grad.abs().max().clamp_min(1e-12)
        err = (params[name].grad - grad).abs().max() / scale
        assert err < 2e-3, f'{case}: gradient of {name} differs by {err:.2e} (relative to max)'


def _shape_table() -> dict:
    with gzip.open(FIXTURES / 'state_dict_shapes.json.gz', 'rt') as fh:
        return json.load(fh)


@pytest.mark.parametrize('name', sorted(_shape_table()))
def test_state_dict_keys_and_shapes_match_reference(name: str) -> None:
    """Released checkpoints (official 001-009) and KAIR option files (001-009): identical state_dict layout."""
    entry = _shape_table()[name]
    with torch.device('meta'):
        net = VRT(**entry['kwargs'])
    sd = net.state_dict()
    assert {k: list(v.shape) for k, v in sd.items()} == entry['shapes']
    assert sorted(k for k, _ in net.named_buffers() if k in sd) == entry['buffers']
    assert sum(p.numel() for p in net.parameters()) == entry['num_params']


def test_strict_load_roundtrip_and_persistent_buffers() -> None:
    net = _tiny()
    sd = net.state_dict()
    assert 'spynet.mean' in sd and 'spynet.std' in sd
    assert 'stage1.residual_group1.blocks.0.attn.position_bias' in sd
    assert 'stage1.residual_group2.blocks.0.attn.relative_position_index' in sd
    other = _tiny()
    other.load_state_dict(sd, strict=True)


@pytest.mark.parametrize(('kwargs', 'in_shape', 'out_shape'), [
    ({'upscale': 4}, (1, 3, 3, 40, 40), (1, 3, 3, 160, 160)),
    ({'upscale': 3}, (1, 2, 3, 40, 40), (1, 2, 3, 120, 120)),
    ({'upscale': 2, 'pa_frames': 4}, (2, 3, 3, 40, 48), (2, 3, 3, 80, 96)),
    ({'upscale': 1}, (1, 2, 3, 48, 40), (1, 2, 3, 48, 40)),
    ({'upscale': 1, 'nonblind_denoising': True}, (1, 2, 4, 40, 40), (1, 2, 3, 40, 40)),
    ({'upscale': 1, 'pa_frames': 0, 'img_size': (4, 32, 32)}, (2, 4, 3, 32, 32), (2, 1, 3, 32, 32)),
])
def test_output_shapes(kwargs: dict, in_shape: tuple, out_shape: tuple) -> None:
    net = _tiny(**kwargs).eval()
    with torch.no_grad():
        assert net(torch.rand(in_shape)).shape == out_shape


def test_gradients_reach_parameters() -> None:
    """With random SpyNet (spynet_path=None) every parameter gets a finite gradient; all but the layers behind
    the zero-initialised last offset convolution get a non-zero one."""
    net = _tiny().train()
    net(torch.rand(1, 3, 3, 40, 40)).square().mean().backward()
    zero = []
    for name, p in net.named_parameters():
        assert p.grad is not None, name
        assert torch.isfinite(p.grad).all(), name
        if not p.grad.any():
            zero.append(name)
    # only layers feeding the zero-initialised final offset conv may have exactly zero gradient at init
    assert all(re.fullmatch(r'stage\d\.pa_deform\.conv_offset\.[024]\.(weight|bias)', n) for n in zero), zero
    assert any(n.startswith('spynet.') and net.get_parameter(n).grad.any() for n, _ in net.named_parameters())


def test_checkpointing_gives_same_gradients() -> None:
    x = torch.rand(1, 3, 3, 40, 40)
    grads = []
    for flags in ({}, {'use_checkpoint_attn': True, 'use_checkpoint_ffn': True}):
        net = _tiny(**flags).train()
        deterministic_fill(net, seed=5)
        net(x).square().mean().backward()
        grads.append({n: p.grad for n, p in net.named_parameters()})
    for name, grad in grads[0].items():
        torch.testing.assert_close(grads[1][name], grad, atol=1e-6, rtol=1e-5, msg=name)


def test_checkpoint_flags_follow_config() -> None:
    net = _tiny(use_checkpoint_attn=True, use_checkpoint_ffn=True, no_checkpoint_attn_blocks=(0, 7),
                no_checkpoint_ffn_blocks=(1,))
    blk = net.stage1.residual_group2.blocks[0]  # the reference hard-codes attention checkpointing here
    assert not blk.use_checkpoint_attn and blk.use_checkpoint_ffn
    assert net.stage2.residual_group1.blocks[0].use_checkpoint_attn
    assert not net.stage2.residual_group1.blocks[0].use_checkpoint_ffn
    assert not net.stage8[1].residual_group.blocks[0].use_checkpoint_attn
    assert net.stage8[2].residual_group.blocks[0].use_checkpoint_attn


def test_bad_inputs_raise_clear_errors() -> None:
    net = _tiny().eval()
    with pytest.raises(ValueError, match='at least 40x40'):
        net(torch.rand(1, 2, 3, 24, 24))
    with pytest.raises(ValueError, match='divisible by 8'):
        net(torch.rand(1, 2, 3, 44, 44))
    with pytest.raises(ValueError, match='expects 3 input channels'):
        net(torch.rand(1, 2, 4, 40, 40))
    vfi = _tiny(upscale=1, pa_frames=0, img_size=(4, 32, 32))
    with pytest.raises(ValueError, match='img_size'):
        vfi(torch.rand(1, 3, 3, 32, 32))
    with pytest.raises(ValueError, match='pa_frames'):
        VRT(pa_frames=3)


def test_bf16_autocast_runs() -> None:
    net = _tiny().eval()
    x = torch.rand(1, 2, 3, 40, 40)
    with torch.no_grad():
        ref = net(x)
        with torch.autocast('cpu', dtype=torch.bfloat16):
            out = net(x)
    assert out.shape == ref.shape and torch.isfinite(out).all()
    assert (out.float() - ref).abs().mean() < 0.05


@pytest.mark.parametrize(('k', 'groups'), [(1, 4), (2, 4), (3, 6)])
def test_sampled_deform_conv_matches_torchvision(k: int, groups: int) -> None:
    """The CPU grid_sample formulation equals torchvision's deform_conv2d (values and all gradients)."""
    gen = torch.Generator().manual_seed(k)
    c, h, w = 12, 9, 11
    tensors = [torch.randn(2, k * c, h, w, generator=gen), 3 * torch.randn(2, 18 * groups, h, w, generator=gen),
               torch.rand(2, 9 * groups, h, w, generator=gen), torch.randn(c, c, 3, 3, generator=gen) / 10,
               torch.randn(c, generator=gen)]
    results = []
    for fn in (lambda x, o, m, wt, b: torchvision.ops.deform_conv2d(x, o, wt, b, padding=(1, 1), mask=m),
               deform_conv3x3_sampled):
        inputs = [t.clone().requires_grad_() for t in tensors]
        out = fn(*inputs)
        out.backward(torch.linspace(-1, 1, out.numel()).view_as(out))
        results.append([out.detach()] + [t.grad for t in inputs])
    for ref, ours in zip(*results):
        torch.testing.assert_close(ours, ref, atol=1e-4, rtol=1e-4)


def test_deform_impls_agree_inside_vrt() -> None:
    net = _tiny(pa_frames=4).eval()
    deterministic_fill(net, seed=3)  # non-zero offset convolution, so the offsets are not just the flows
    x = torch.rand(1, 3, 3, 40, 40)
    with torch.no_grad():
        sampled = net(x)
        for m in net.modules():
            if isinstance(m, DCNv2PackFlowGuided):
                m.impl = 'torchvision'
        torch.testing.assert_close(net(x), sampled, atol=1e-4, rtol=1e-4)
