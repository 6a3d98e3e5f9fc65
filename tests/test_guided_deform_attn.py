"""Guided deformable attention: equality with a per-pixel loop written from the CUDA kernel, gradients, modules."""

from __future__ import annotations

import pytest
import torch

from models import layers_deform_attn, layers_guided_deform_attn
from models.layers_deform_attn import _AttendSampled, deform_attn
from models.layers_guided_deform_attn import DeformAttnPack, GuidedDeformAttnPack
from tests.support.deform_attn_loop import attn_inputs, naive_deform_attn

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize(
    "n,clip,c,heads,groups,kh,kw,stride,pad,dil",
    [
        (1, 2, 4, 2, 2, 3, 3, 1, 1, 1),  # RVRT's setting in miniature
        (2, 2, 6, 3, 4, 3, 3, 1, 1, 1),  # several clips, groups straddling k and v
        (1, 3, 4, 1, 1, 3, 3, 1, 1, 1),  # clip 3: frame (j + n) % 3 selection
        (1, 1, 4, 2, 8, 1, 3, 2, 0, 2),  # 1x3 window, stride 2, dilation 2
    ],
)
def test_matches_naive_loop(n, clip, c, heads, groups, kh, kw, stride, pad, dil):
    q, kv, offset = attn_inputs(n, clip, c, groups=groups, kh=kh, kw=kw)
    args = (kh, kw, stride, pad, dil, heads, groups, clip)
    ours = deform_attn(q, kv, offset, *args)
    ref = naive_deform_attn(q, kv, offset, *args)
    assert ours.shape == q.shape
    torch.testing.assert_close(ours, ref, rtol=1e-10, atol=1e-10)


def test_out_of_range_and_integer_positions():
    """Samples on the border, exactly on -1 / H, and far outside behave like the kernel (zero outside)."""
    q, kv, _ = attn_inputs(c=4, h=4, w=4)
    offset = torch.zeros(2, 2 * 2 * 9 * 2, 4, 4, dtype=torch.float64)
    offset[:, 0::7] = -1.0  # integer shifts land exactly on the -1 boundary for the first row/column
    offset[:, 1::5] = 4.0
    offset[:, 3::11] = 100.0  # far outside
    offset[:, 2::13] = -0.5
    args = (3, 3, 1, 1, 1, 2, 2, 2)
    torch.testing.assert_close(deform_attn(q, kv, offset, *args), naive_deform_attn(q, kv, offset, *args),
                               rtol=1e-10, atol=1e-10)


def test_float32_and_single_pixel_width():
    q, kv, offset = attn_inputs(c=4, h=3, w=1, dtype=torch.float32, scale=0.7)
    args = (3, 3, 1, 1, 1, 2, 2, 2)
    torch.testing.assert_close(deform_attn(q, kv, offset, *args), naive_deform_attn(q, kv, offset, *args),
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("recompute", [False, True])
def test_gradcheck(recompute):
    q, kv, offset = attn_inputs(c=2, h=3, w=3, groups=2, scale=1.3)
    q.requires_grad_(True)
    kv.requires_grad_(True)
    offset.requires_grad_(True)

    def fn(q, kv, offset):
        return deform_attn(q, kv, offset, 3, 3, 1, 1, 1, 1, 2, 2, recompute=recompute)

    assert torch.autograd.gradcheck(fn, (q, kv, offset), eps=1e-6, atol=1e-5)


def test_recompute_gives_same_gradients():
    q, kv, offset = attn_inputs(c=4, dtype=torch.float32)
    grads = []
    for recompute in (False, True):
        leaves = [t.clone().requires_grad_(True) for t in (q, kv, offset)]
        out = deform_attn(*leaves, 3, 3, 1, 1, 1, 2, 2, 2, recompute=recompute)
        (out * torch.linspace(-1, 1, out.numel()).view(out.shape)).sum().backward()
        grads.append([t.grad for t in leaves])
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b)


def test_written_out_attention_backward_matches_float64_autograd():
    """The attention over the sampled keys and values (running multiply-adds, backward written out into a gradient
    tensor of each): output and all three gradients at float32 rounding of float64 autograd of the plain formula,
    with heads, frames and kernel points > 1 (the gradcheck runs one head)."""
    gen = torch.Generator().manual_seed(3)
    b, s, heads, hd, kk, hw = 2, 2, 3, 4, 9, 20
    keys, values = torch.randn(2, b, s, heads, hd, kk, hw, generator=gen)
    qh = torch.randn(b, 1, heads, hd, 1, hw, generator=gen)
    grad_out = torch.randn(b, heads, hd, hw, generator=gen)
    leaves = [t.clone().requires_grad_(True) for t in (keys, values, qh)]
    out = _AttendSampled.apply(*leaves)
    grads = torch.autograd.grad(out, leaves, grad_out)
    assert all(g.is_contiguous() for g in grads)  # the samples' views take them without a copy
    got = [out, *grads]
    k64, v64, q64 = (t.double().requires_grad_(True) for t in (keys, values, qh))
    attn = (k64 * q64).sum(3).transpose(1, 2).reshape(b, heads, s * kk, hw).softmax(2).view(b, heads, s, kk, hw)
    ref = (v64 * attn.transpose(1, 2).unsqueeze(3)).sum((1, 4))
    expected = [ref, *torch.autograd.grad(ref, (k64, v64, q64), grad_out.double())]
    for a, e in zip(got, expected):
        torch.testing.assert_close(a.double(), e, rtol=0, atol=2e-6 * e.abs().max().item())


def test_default_keeps_small_samples_and_recomputes_large_ones(monkeypatch):
    """``recompute=None`` keeps the sampled keys and values (each half of the samples, sampled apart) for backward
    while they fit RECOMPUTE_ABOVE_BYTES and recomputes them above it; the gradients are the same bits either
    way."""
    q, kv, offset = attn_inputs(c=4, dtype=torch.float32)
    half = (2, 2, 2, 2, 9, 30)  # keys (or values): 2 query frames x 2 kv frames x 2 heads x 2 channels x 3 x 3 x 30 px
    kept, grads = [], []
    for budget in (2**40, 0):
        monkeypatch.setattr(layers_deform_attn, 'RECOMPUTE_ABOVE_BYTES', budget)
        leaves = [t.clone().requires_grad_(True) for t in (q, kv, offset)]
        saved = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(tuple(t.shape)) or t, lambda t: t):
            out = deform_attn(*leaves, 3, 3, 1, 1, 1, 2, 2, 2)
        kept.append(saved.count(half))
        grads.append(torch.autograd.grad(out.square().sum(), leaves))
    assert kept == [2, 0]
    for a, b in zip(*grads):
        assert torch.equal(a, b)


@pytest.mark.parametrize("groups", [2, 1])
def test_keys_and_values_sampled_apart_for_an_even_group_count(monkeypatch, groups):
    """With an even G the keys and the values are sampled by two calls, each half of all samples (without autograd
    the keys are freed before the values are sampled); an odd G, whose middle group holds both, samples once. The
    output equals the per-pixel loop either way."""
    q, kv, offset = attn_inputs(c=4, groups=groups)
    sampled = []

    def spy(x, grid, **kwargs):
        out = grid_sample(x, grid, **kwargs)
        sampled.append(out.numel())
        return out

    grid_sample = layers_deform_attn.grid_sample
    monkeypatch.setattr(layers_deform_attn, "grid_sample", spy)
    args = (3, 3, 1, 1, 1, 2, groups, 2)
    with torch.no_grad():
        out = deform_attn(q, kv, offset, *args)
    every = 2 * kv.numel() * 9  # both query frames sample all kv channels of both kv frames at 3 x 3 points
    assert sampled == ([every // 2] * 2 if groups % 2 == 0 else [every])
    torch.testing.assert_close(out, naive_deform_attn(q, kv, offset, *args), rtol=1e-10, atol=1e-10)


def test_without_autograd_the_cpu_attends_in_pieces_of_whole_heads(monkeypatch):
    """Without autograd on the CPU the keys and the values are sampled in pieces of whole groups and whole heads,
    each at most CPU_SAMPLES_PIECE_BYTES of samples (2 groups of 6 channels hold 3 heads of 4: the smallest piece),
    and a piece still above it in runs of query pixels; the output has the bits of one piece and of the autograd
    path whatever the pieces."""
    q, kv, offset = attn_inputs(c=24, groups=8, dtype=torch.float32)  # 5 x 6 pixels
    args = (3, 3, 1, 1, 1, 6, 8, 2)
    sampled = []

    def spy(x, grid, **kwargs):
        sampled.append((x.shape[0] * x.shape[1] // 4, grid.shape[2]))  # channels per query and kv frame, pixels
        return grid_sample(x, grid, **kwargs)

    grid_sample = layers_deform_attn.grid_sample
    monkeypatch.setattr(layers_deform_attn, "grid_sample", spy)
    smallest = 2 * 2 * 12 * 9 * 4  # bytes of one pixel's samples of a piece: 2 query x 2 kv frames, 12 channels
    expected = {
        2**40: [(24, 30)] * 2,  # keys, values
        smallest * 30: [(12, 30)] * 4,  # each piece's keys, values
        smallest * 16: [(12, 16), (12, 16), (12, 14), (12, 14)] * 2,  # and in runs of 16 pixels
    }
    outs = []
    for budget, calls in expected.items():
        monkeypatch.setattr(layers_deform_attn, "CPU_SAMPLES_PIECE_BYTES", budget)
        sampled.clear()
        with torch.no_grad():
            outs.append(deform_attn(q, kv, offset, *args))
        assert sampled == calls, budget
    outs.append(deform_attn(q, kv, offset.requires_grad_(), *args).detach())
    for out in outs[1:]:
        assert torch.equal(out, outs[0])


def test_autocast_bf16_cpu():
    q, kv, offset = attn_inputs(c=4, dtype=torch.float32)
    ref = deform_attn(q, kv, offset, 3, 3, 1, 1, 1, 2, 2, 2)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = deform_attn(q.bfloat16(), kv.bfloat16(), offset, 3, 3, 1, 1, 1, 2, 2, 2)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), ref, rtol=0, atol=1e-2)  # 2.0e-3 measured


def test_bad_shapes_raise_clear_errors():
    q, kv, offset = attn_inputs(c=4)
    with pytest.raises(ValueError, match="offset must be"):
        deform_attn(q, kv, offset[:, :-2], 3, 3, 1, 1, 1, 2, 2, 2)
    with pytest.raises(ValueError, match="attention_heads"):
        deform_attn(q, kv, offset, 3, 3, 1, 1, 1, 3, 2, 2)
    with pytest.raises(ValueError, match="clip_size"):
        deform_attn(q, kv, offset, 3, 3, 1, 1, 1, 2, 2, 3)


def test_guided_pack_keys_shapes_and_flow_guidance():
    torch.manual_seed(0)
    c, groups = 8, 4
    m = GuidedDeformAttnPack(c, c, attention_window=(3, 3), deformable_groups=groups, attention_heads=4, clip_size=2)
    keys = {k: tuple(v.shape) for k, v in m.state_dict().items()}
    assert keys["conv_offset.0.weight"] == (64, 3 * c + 4, 1, 1, 1)
    assert keys["conv_offset.10.weight"] == (2 * groups * 9 * 2, 64, 1, 1, 1)
    assert keys["proj_q.1.weight"] == (2 * c, c) and keys["proj.1.weight"] == (c, 2 * c)
    assert keys["mlp.1.fc1.weight"] == (2 * c, c) and keys["mlp.1.fc2.weight"] == (c, 2 * c)
    assert sorted({k.split(".")[0] for k in keys}) == ["conv_offset", "mlp", "proj", "proj_k", "proj_q", "proj_v"]
    n, t, h, w = 1, 2, 6, 7
    q, k, v = (torch.randn(n, t, c, h, w) for _ in range(3))
    warped = [torch.randn(n, t, c, h, w) for _ in range(2)]
    flows = [torch.randn(n, t, 2, h, w) for _ in range(2)]
    out, f1, f2 = m(q, k, v, warped, flows, True)
    assert out.shape == (n, t, c, h, w)
    # zero-initialised offset head: the refined flows are exactly the input flows
    torch.testing.assert_close(f1, flows[0])
    torch.testing.assert_close(f2, flows[1])
    out.sum().backward()
    assert m.conv_offset[-1].weight.grad is not None and m.conv_offset[-1].weight.grad.abs().sum() > 0
    assert m(q, k, v, warped, flows, False).shape == (n, t, c, h, w)


def test_guided_pack_offset_network_same_without_autograd():
    """Without autograd the offset network runs channels-last with fused LeakyReLUs; with it, the NCHW layers. Both
    give the same offsets, refined flows and output up to the convolutions' rounding, and the offset network
    visibly moves them (a random last layer, so a wrong activation or layer order would show)."""
    torch.manual_seed(0)
    c = 8
    m = GuidedDeformAttnPack(c, c, deformable_groups=4, attention_heads=4, clip_size=2)
    torch.nn.init.normal_(m.conv_offset[-1].weight, std=0.02)
    q, k, v, *warped = (torch.randn(1, 2, c, 9, 10) for _ in range(5))
    flows = [torch.randn(1, 2, 2, 9, 10) for _ in range(2)]
    with torch.no_grad():
        fast = m(q, k, v, warped, flows, True)
    ref = m(q, k, v, warped, flows, True)  # parameters record gradients: the NCHW path
    assert ref[0].requires_grad
    for a, b in zip(fast, ref):
        torch.testing.assert_close(a, b.detach(), rtol=1e-5, atol=1e-5)
    assert (fast[1] - flows[0]).abs().max() > 5e-3  # the learned residue moved the flows
    with torch.no_grad():
        m.conv_offset[1].negative_slope = 0.0  # the activation is read from the network in both paths
        assert (m(q, k, v, warped, flows, True)[1] - fast[1]).abs().max() > 1e-4


@pytest.mark.parametrize("groups", [4, 3])
def test_guided_pack_attends_as_deform_attn_on_its_projections(monkeypatch, groups):
    """GuidedDeformAttnPack hands the core its key and value projections as the kv frames (for an even G each copied
    once, contiguous, apart): the same bits as deform_attn on the concatenated projections."""
    torch.manual_seed(0)
    c, heads = 6, 4
    m = GuidedDeformAttnPack(c, c, deformable_groups=groups, attention_heads=heads, clip_size=2)
    torch.nn.init.normal_(m.conv_offset[-1].weight, std=0.1)  # off the pixel grid
    q, k, v, *warped = (torch.randn(1, 2, c, 5, 6) for _ in range(5))
    flows = [torch.randn(1, 2, 2, 5, 6) for _ in range(2)]
    calls = []
    run = layers_guided_deform_attn.attend

    def spy(q_, parts, offset, *rest):
        out = run(q_, parts, offset, *rest)
        calls.append((parts, offset, out))
        return out

    monkeypatch.setattr(layers_guided_deform_attn, "attend", spy)
    m(q, k, v, warped, flows, False)
    parts, offset, out = calls[0]
    assert len(parts) == (2 if groups % 2 == 0 else 1) and all(p.is_contiguous() for p in parts)
    kv = torch.cat([m.proj_k(k), m.proj_v(v)], dim=2)
    assert torch.equal(out, deform_attn(m.proj_q(q).flatten(0, 1), kv, offset, 3, 3, 1, 1, 1, heads, groups, 2))


def test_deform_attn_pack():
    m = DeformAttnPack(8, 8, attention_window=(3, 3), deformable_groups=4, attention_heads=2, clip_size=2)
    keys = {k: tuple(v.shape) for k, v in m.state_dict().items()}
    assert keys["conv_offset.weight"] == (2 * 4 * 9 * 2, 8 * 3, 3, 3)
    assert keys["proj_q.1.weight"] == (8, 8) and keys["mlp.1.fc1.weight"] == (16, 8)
    q, k, v = torch.randn(2, 1, 8, 5, 5), torch.randn(2, 2, 8, 5, 5), torch.randn(2, 2, 8, 5, 5)
    assert m(q, k, v).shape == (2, 1, 8, 5, 5)
