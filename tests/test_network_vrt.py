"""VRT network tests (golden fixtures made with the reference implementation, see tests/fixtures/vrt/README.md)."""

from __future__ import annotations

import functools
import re
from pathlib import Path

import pytest
import torch
import torchvision

from models.layers_conv import nchw_trains_faster
from models.layers_deform_conv import DCNv2PackFlowGuided, deform_conv3x3_sampled
from models.network_vrt import VRT
from tests.support.golden import VRT_GOLDEN as GOLDEN
from tests.support.golden import assert_grads_close, assert_same_layout, deterministic_fill, shape_table

FIXTURES = Path(__file__).parent / 'fixtures' / 'vrt'


pytestmark = pytest.mark.usefixtures('one_thread')


TINY = {
    'depths': (2,) * 7 + (2, 1), 'embed_dims': (16,) * 7 + (24, 24), 'num_heads': (2,) * 9,
    'indep_reconsts': (8,), 'window_size': (2, 4, 4), 'drop_path_rate': 0.0, 'deformable_groups': 4,
}


def _tiny(**kwargs) -> VRT:
    torch.manual_seed(0)
    return VRT(**{**TINY, 'img_size': (3, 40, 40), **kwargs})


@pytest.mark.parametrize('case', sorted(GOLDEN))
def test_golden_matches_reference(case: str) -> None:
    """Same weights and input as the reference run -> same output and parameter gradients, to fp32 rounding."""
    out_atol, grad_rel = GOLDEN[case]
    data = torch.load(FIXTURES / f'golden_{case}.pt', weights_only=True)
    net = VRT(**data['config']).eval()
    deterministic_fill(net, data['fill_seed'])
    out = net(data['input'])
    assert out.shape == data['output'].shape
    torch.testing.assert_close(out, data['output'], atol=out_atol, rtol=0)
    loss = out.square().mean()
    assert abs(loss.item() - data['loss']) <= out_atol
    loss.backward()
    assert data['grads']
    assert_grads_close(net, data['grads'], case, rel=grad_rel)


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


def _record_head_layout(net: VRT) -> list[bool]:
    """Whether each call of the head's first convolution got channels-last features (recorded by a pre-hook)."""
    seen: list[bool] = []
    first = net.conv_before_upsample[0] if hasattr(net, 'conv_before_upsample') else net.conv_last
    first.register_forward_pre_hook(lambda _, args: seen.append(
        args[0].is_contiguous(memory_format=torch.channels_last)))
    return seen


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
    layouts = _record_head_layout(net) if kwargs.get('pa_frames', 2) else []
    with torch.no_grad():
        assert net(torch.rand(in_shape)).shape == out_shape
    # the head's convolutions run channels-last (1.3-2x faster than NCHW in oneDNN, benchmarks/RESULTS.md)
    assert all(layouts) and bool(layouts) == bool(kwargs.get('pa_frames', 2)), layouts


def test_gradients_reach_parameters() -> None:
    """With random SpyNet (spynet_path=None) every parameter gets a finite gradient; all but the layers behind
    the zero-initialised last offset convolution get a non-zero one."""
    net = _tiny().train()
    layouts = _record_head_layout(net)
    net(torch.rand(1, 3, 3, 40, 40)).square().mean().backward()
    # with autograd the head runs in the layout conv_layout picks for training (NCHW on AVX2 CPUs, else
    # channels-last), and on the CPU one frame at a time (heap-sized activations instead of fresh mappings,
    # network_vrt._reconstruct)
    assert layouts == [not nchw_trains_faster()] * 3
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


# Tiny configurations (on top of TINY) for the table of input sizes below. Every verdict in SIZE_TABLE was
# established by running the reference implementation on the same configuration and shape (scratch harness, see
# tests/fixtures/vrt/README.md): 'ok' where it computes, else a phrase of our refusal naming the constraint that
# made the reference fail.
SIZE_CONFIGS: dict[str, dict] = {
    # one mutual block in every stage (int(2 * 0.75) = 1); window 4: SpyNet's limit (above 32) dominates
    'mut_w4': {'upscale': 4},
    # window 8: the mutual blocks of stage 4 (1/8 scale) need 64x64
    'mut_w8': {'upscale': 1, 'window_size': (2, 8, 8)},
    'pa4': {'upscale': 4, 'pa_frames': 4},
    'pa6': {'upscale': 1, 'pa_frames': 6, 'window_size': (6, 8, 8), 'embed_dims': (24,) * 9, 'deformable_groups': 6},
    # the demo's depths (1 everywhere): no mutual blocks, so every stage shrinks its windows
    'nomut_w8': {'upscale': 1, 'window_size': (2, 8, 8), 'depths': (1,) * 9},
    # frame interpolation with KAIR 009's window (4, 8, 8): mutual blocks everywhere, or none in stage 4
    'vfi_w8': {'upscale': 1, 'pa_frames': 0, 'window_size': (4, 8, 8), 'img_size': (4, 32, 32), 'indep_reconsts': ()},
    'vfi_w8_s4': {'upscale': 1, 'pa_frames': 0, 'window_size': (4, 8, 8), 'img_size': (4, 32, 32),
                  'indep_reconsts': (), 'depths': (2, 2, 2, 1, 2, 2, 2, 2, 1)},
    'vfi_w6_s4': {'upscale': 1, 'pa_frames': 0, 'window_size': (2, 6, 6), 'img_size': (2, 32, 32),
                  'indep_reconsts': (), 'depths': (2, 2, 2, 1, 2, 2, 2, 2, 1)},
    'vfi_1frame': {'upscale': 1, 'pa_frames': 0, 'window_size': (1, 8, 8), 'img_size': (1, 32, 32),
                   'mul_attn_ratio': 0.0},
}
SIZE_TABLE = [
    ('mut_w4', (1, 2, 3, 40, 40), 'ok'),
    ('mut_w4', (2, 2, 3, 40, 48), 'ok'),
    ('mut_w4', (1, 2, 3, 32, 32), 'above 32'),
    ('mut_w4', (1, 2, 3, 64, 32), 'above 32'),
    ('mut_w4', (1, 2, 3, 36, 40), 'multiples of 8'),
    ('mut_w4', (1, 1, 3, 64, 64), 'at least 2 frames'),
    ('mut_w8', (1, 2, 3, 64, 64), 'ok'),
    ('mut_w8', (1, 2, 3, 56, 56), 'at least 64x64'),
    ('mut_w8', (1, 2, 3, 64, 48), 'at least 64x64'),
    ('pa4', (1, 3, 3, 40, 40), 'ok'),
    ('pa4', (1, 2, 3, 64, 64), 'at least 3 frames'),
    ('pa6', (1, 3, 3, 64, 64), 'at least 4 frames'),
    ('pa6', (1, 4, 3, 56, 56), 'at least 64x64'),
    ('nomut_w8', (1, 1, 3, 40, 40), 'ok'),
    ('nomut_w8', (2, 2, 3, 40, 48), 'ok'),
    ('nomut_w8', (1, 2, 3, 32, 64), 'above 32'),
    ('vfi_w8', (1, 4, 3, 64, 64), 'ok'),
    ('vfi_w8', (1, 4, 3, 32, 32), 'at least 64x64'),
    ('vfi_w8', (1, 3, 3, 64, 64), 'img_size'),
    ('vfi_w8_s4', (1, 4, 3, 32, 32), 'ok'),
    ('vfi_w8_s4', (1, 4, 3, 32, 64), 'ok'),
    ('vfi_w8_s4', (1, 4, 3, 24, 24), 'at least 32x32'),
    ('vfi_w6_s4', (1, 2, 3, 24, 40), 'ok'),
    ('vfi_w6_s4', (1, 2, 3, 16, 16), 'at least 24x24'),
    ('vfi_1frame', (1, 1, 3, 8, 8), 'ok'),
    ('vfi_1frame', (1, 1, 3, 16, 64), 'ok'),
    ('vfi_1frame', (1, 1, 3, 36, 40), 'multiples of 8'),
]


@functools.cache
def _sized(config: str) -> VRT:
    return _tiny(**SIZE_CONFIGS[config]).eval()


@pytest.mark.parametrize(('config', 'shape', 'verdict'), SIZE_TABLE)
def test_input_sizes_follow_reference(config: str, shape: tuple, verdict: str) -> None:
    """Computes exactly what the reference computes; anything else is refused in one line naming the constraint."""
    net = _sized(config)
    x = torch.rand(shape, generator=torch.Generator().manual_seed(0))
    if verdict == 'ok':
        with torch.no_grad():
            assert torch.isfinite(net(x)).all()
        return
    with pytest.raises(ValueError, match=re.escape(verdict)) as info:
        net(x)
    assert '\n' not in str(info.value) and str(shape) in str(info.value)


def test_size_refusal_names_the_nearest_working_size() -> None:
    with pytest.raises(ValueError, match=r'Nearest working size 64x64: .* tiles of at least 64x64$'):
        _sized('mut_w8')(torch.rand(1, 2, 3, 56, 60))
    with pytest.raises(ValueError, match=r'Nearest working size 40x48: .* tiles of at least 40x40$'):
        _sized('mut_w4')(torch.rand(1, 2, 3, 36, 44))
    with pytest.raises(ValueError, match=r'stage 3 \(1/4 scale\) has mutual-attention blocks.*size 32x32'):
        _sized('vfi_w8_s4')(torch.rand(1, 4, 3, 24, 24))


@pytest.mark.parametrize(('kwargs', 'match'), [
    ({'pa_frames': 6}, 'divisible by 3'),  # 16 channels cannot form 3 weight groups
    ({'pa_frames': 4, 'embed_dims': (24,) * 9, 'deformable_groups': 3}, 'use deformable_groups=2'),
    # stages 5-7 unfold channels into 2x2 pixels (depth 1: no mutual blocks, which would need C % 4 == 0 to build)
    ({'embed_dims': (22,) * 9, 'deformable_groups': 2, 'depths': (1,) * 9}, 'divisible by 4'),
])
def test_configs_no_input_can_run_are_refused(kwargs: dict, match: str) -> None:
    """Channel settings the reference fails on for every input (torchvision's deformable-convolution grouping,
    the 2x2 unfolding) are refused before any computation."""
    with pytest.raises(ValueError, match=match):
        _tiny(**kwargs)(torch.rand(1, 4, 3, 40, 40))


def test_bad_inputs_raise_clear_errors() -> None:
    net = _tiny().eval()
    with pytest.raises(ValueError, match='above 32'):
        net(torch.rand(1, 2, 3, 24, 24))
    with pytest.raises(ValueError, match='multiples of 8'):
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
    x = torch.rand(1, 2, 3, 40, 40, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref = net(x)
        with torch.autocast('cpu', dtype=torch.bfloat16):
            out = net(x)
    assert out.shape == ref.shape and torch.isfinite(out).all()
    assert (out.float() - ref).abs().mean() < 1e-3  # 1.4e-4 measured (seeds 0-2: 1.3e-4 to 1.4e-4)


@pytest.mark.parametrize(('k', 'groups'), [(1, 4), (2, 4), (3, 6)])
def test_sampled_deform_conv_matches_torchvision(k: int, groups: int) -> None:
    """The CPU grid_sample formulation equals torchvision's deform_conv2d (values and all gradients); without
    autograd (its grid built in place) it gives the same bits as with it."""
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
    with torch.no_grad():  # the grid written in place without autograd: the recording path's bits
        assert torch.equal(deform_conv3x3_sampled(*tensors), results[1][0])


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
