"""VRT network tests (golden fixtures made with the reference implementation, see tests/fixtures/vrt/README.md)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
import torchvision

from models.layers_deform_conv import DCNv2PackFlowGuided, deform_conv3x3_sampled
from models.network_vrt import VRT
from tests.golden import assert_grads_close, assert_same_layout, deterministic_fill, shape_table

FIXTURES = Path(__file__).parent / 'fixtures' / 'vrt'


pytestmark = pytest.mark.usefixtures('one_thread')


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
    assert data['grads']
    assert_grads_close(net, data['grads'], case)


@pytest.mark.parametrize('name', sorted(shape_table(FIXTURES)))
def test_state_dict_keys_and_shapes_match_reference(name: str) -> None:
    """Released checkpoints (official 001-009) and KAIR option files (001-009): identical state_dict layout."""
    assert_same_layout(VRT, shape_table(FIXTURES)[name])


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
