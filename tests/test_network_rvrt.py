"""RVRT network tests.

Fixtures in tests/fixtures/rvrt/ were made by running the reference ``network_rvrt.py`` (RVRT repository) in a
scratch directory, with its CUDA ``deform_attn`` replaced by a gather-based CPU implementation of the kernel:
``state_dict_shapes.json.gz`` holds ``{key: shape}`` of the KAIR option files 001-006, the released-model
constructors and the defaults; ``golden_<case>.pt`` holds the output (every second pixel) and some parameter
gradients of tiny configurations filled with ``deterministic_fill`` on a seeded input. ``golden_single_clip.pt``
(3 frames at 133x133, upscale 1: one clip, so no deformable attention runs) was made the same way with our
``models.layers_deform_attn.deform_attn`` substituted for the CUDA op.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from models.network_rvrt import RVRT
from tests.support.golden import RVRT_GOLDEN as GOLDEN
from tests.support.golden import assert_grads_close, assert_same_layout, deterministic_fill, shape_table

FIXTURES = Path(__file__).parent / 'fixtures' / 'rvrt'
TINY = dict(clip_size=2, window_size=(2, 4, 4), num_blocks=(1, 1, 1), depths=(2, 2, 2), embed_dims=(16, 16, 16),
            num_heads=(2, 2, 2), inputconv_groups=(1, 2, 2, 4, 4, 2), deformable_groups=4, attention_heads=4)


pytestmark = pytest.mark.usefixtures('one_thread')


@pytest.mark.parametrize('name', sorted(shape_table(FIXTURES)))
def test_state_dict_keys_and_shapes_match_reference(name: str) -> None:
    """KAIR options 001-006, released-model constructors and defaults: identical state_dict layout."""
    assert_same_layout(RVRT, shape_table(FIXTURES)[name])


STATS_ATOL = 2e-7  # mean, mean |x| and loss: measured at most 6e-8


@pytest.mark.parametrize('case', sorted(GOLDEN))
def test_golden_matches_reference(case: str) -> None:
    """Same weights and input as the reference run -> same output and parameter gradients, to fp32 rounding."""
    out_atol, grad_rel = GOLDEN[case]
    data = torch.load(FIXTURES / f'golden_{case}.pt', weights_only=True)
    torch.manual_seed(0)
    net = RVRT(**data['config'])
    deterministic_fill(net, data['fill_seed'])
    x = torch.rand(data['input_shape'], generator=torch.Generator().manual_seed(data['input_seed']))
    out = net(x)
    torch.testing.assert_close(out.detach()[..., ::2, ::2], data['output_sub'], atol=out_atol, rtol=0)
    assert abs(out.mean().item() - data['output_mean']) <= STATS_ATOL
    assert abs(out.abs().mean().item() - data['output_abs_mean']) <= STATS_ATOL
    loss = out.square().mean()
    assert abs(loss.item() - data['loss']) <= STATS_ATOL
    loss.backward()
    assert len(data['grads']) >= 7
    assert_grads_close(net, data['grads'], case, rel=grad_rel)


def _tiny(**kwargs) -> RVRT:
    torch.manual_seed(0)
    return RVRT(**{**TINY, **kwargs})


@pytest.mark.parametrize(
    'kwargs,shape,out_hw',
    [
        ({'upscale': 4}, (1, 4, 3, 36, 40), (144, 160)),
        ({'upscale': 1}, (1, 4, 3, 132, 136), (132, 136)),
        ({'upscale': 1, 'nonblind_denoising': True}, (1, 4, 4, 132, 132), (132, 132)),
    ],
)
def test_shapes_and_backward(kwargs: dict, shape: tuple, out_hw: tuple) -> None:
    net = _tiny(**kwargs)
    out = net(torch.rand(shape))
    assert out.shape == (shape[0], shape[1], 3, *out_hw)
    out.mean().backward()
    grads = {n: p.grad for n, p in net.named_parameters()}
    assert all(g is not None and torch.isfinite(g).all() for g in grads.values())
    assert grads['conv_last.weight'].abs().sum() > 0
    assert grads['deform_align.forward_2.conv_offset.10.weight'].abs().sum() > 0


def test_single_clip() -> None:
    """Two frames: one clip, no alignment step; still a valid forward."""
    with torch.no_grad():
        assert _tiny(upscale=4)(torch.rand(2, 2, 3, 36, 36)).shape == (2, 2, 3, 144, 144)


def test_mirror_flag_is_per_forward() -> None:
    """A mirrored input does not change how a later, ordinary input is processed (reference bug)."""
    net = _tiny(upscale=4).eval()
    g = torch.Generator().manual_seed(3)
    half = torch.rand(1, 2, 3, 36, 36, generator=g)
    mirrored = torch.cat([half, half.flip(1)], dim=1)
    plain = torch.rand(1, 4, 3, 36, 36, generator=g)
    assert RVRT.is_mirror_extended(mirrored) and not RVRT.is_mirror_extended(plain)
    with torch.no_grad():
        expected = net(plain)
        out_mirrored = net(mirrored)
        after = net(plain)
        # the mirrored shortcut (forward flows = flipped backward flows) equals computing both directions
        forward, backward = net.compute_flow(mirrored, mirrored=False)
        torch.testing.assert_close(forward, backward.flip(1), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(after, expected, atol=0, rtol=0)
    assert torch.isfinite(out_mirrored).all()


def test_upsampler_takes_one_frame_at_a_time_on_the_cpu(monkeypatch) -> None:
    """In training as in evaluation the x4 upsampler runs frame by frame on the CPU (activations under glibc's mmap
    ceiling); the output is the batched upsampler's, bit for bit, and the gradients agree to rounding. A traced
    graph (here: ``in_graph`` reporting a tracer) keeps all frames in one call."""
    x = torch.rand(1, 4, 3, 36, 36, generator=torch.Generator().manual_seed(5))
    results = []
    for traced in (False, True):
        net = _tiny(upscale=4)
        calls = []
        net.upsampler.register_forward_hook(lambda module, args, out: calls.append(args[0].shape[0]))
        if traced:
            monkeypatch.setattr('models.network_rvrt.in_graph', lambda: True)
        out = net(x)
        out.square().mean().backward()
        assert calls == ([4] if traced else [1, 1, 1, 1])
        results.append((out.detach(), {n: p.grad for n, p in net.named_parameters()}))
    (out, grads), (out_batched, grads_batched) = results
    assert torch.equal(out, out_batched)
    for name, grad in grads_batched.items():
        torch.testing.assert_close(grads[name], grad, atol=1e-7, rtol=1e-4)


def test_checkpointing_gives_same_gradients() -> None:
    x = torch.rand(1, 4, 3, 36, 36, generator=torch.Generator().manual_seed(4))
    grads = []
    for ckpt in (False, True):
        net = _tiny(upscale=4, use_checkpoint_attn=ckpt, use_checkpoint_ffn=ckpt, no_checkpoint_attn_blocks=(1,))
        net(x).square().mean().backward()
        grads.append({n: p.grad for n, p in net.named_parameters()})
    for name, grad in grads[0].items():
        torch.testing.assert_close(grads[1][name], grad, atol=1e-6, rtol=1e-4)


# Input sizes and the reference's verdicts, established by running the reference RVRT (its CUDA deform_attn
# replaced by ours) on the TINY configuration: 'ok' where it computes (output H, W given), else a phrase of our
# refusal naming the constraint that made the reference fail.
SIZE_TABLE = [
    (4, (1, 3, 3, 36, 36), (144, 144)),  # T = 3 < 2 * clip_size: one clip of 3 frames, no alignment
    (4, (2, 3, 3, 33, 41), (132, 164)),
    (4, (1, 8, 3, 36, 36), (144, 144)),
    (4, (1, 1, 3, 36, 36), 'multiple of 2'),
    (4, (1, 5, 3, 36, 36), 'use 4 or 6'),
    (4, (1, 2, 3, 32, 40), 'larger than 32x32'),
    (1, (1, 3, 3, 133, 133), (136, 136)),  # one clip: features of ceil(H / 4) rows are never aligned with flows
    (1, (1, 2, 3, 132, 133), (132, 136)),
    (1, (1, 4, 3, 133, 133), 'multiples of 4'),  # two clips: ceil(133 / 4) features against 133 // 4 flows
    (1, (1, 2, 3, 130, 130), 'at least 132'),
    (1, (1, 5, 3, 132, 132), 'multiple of 2'),
]


@pytest.mark.parametrize(('upscale', 'shape', 'verdict'), SIZE_TABLE)
def test_input_sizes_follow_reference(upscale: int, shape: tuple, verdict: tuple | str) -> None:
    net = _tiny(upscale=upscale).eval()
    x = torch.rand(shape, generator=torch.Generator().manual_seed(0))
    if isinstance(verdict, tuple):
        with torch.no_grad():
            out = net(x)
        assert out.shape == (*shape[:2], 3, *verdict) and torch.isfinite(out).all()
        return
    with pytest.raises(ValueError, match=verdict) as info:
        net(x)
    assert '\n' not in str(info.value)


def test_bad_input_and_config_errors() -> None:
    net = _tiny(upscale=4)
    with pytest.raises(ValueError, match='larger than 32x32'):
        net(torch.rand(1, 2, 3, 32, 36))
    with pytest.raises(ValueError, match='3 input channels'):
        net(torch.rand(1, 2, 4, 36, 36))
    with pytest.raises(ValueError, match='at least 132 .* pad to 132x132'):
        _tiny(upscale=1)(torch.rand(1, 2, 3, 128, 132))
    with pytest.raises(ValueError, match='upscale'):
        RVRT(upscale=2)
    with pytest.raises(ValueError, match='clip_size'):
        RVRT(clip_size=3)


def test_missing_spynet_file_is_an_error(tmp_path) -> None:
    with pytest.raises(FileNotFoundError, match='spynet'):
        RVRT(**TINY, spynet_path=str(tmp_path / 'spynet.pth'))
