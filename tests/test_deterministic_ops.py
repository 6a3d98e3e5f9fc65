"""Deterministic backward for the CUDA-nondeterministic ops of VRT/RVRT (``models.layers_warp`` and its users).

The CPU kernels are deterministic, so here the formulations are forced on with ``force_deterministic_kernels`` and
compared with the default ops (values and gradients), and whole networks are compared with the switch on and off.
The meta device runs the real switch (deterministic mode on a device that is not the CPU): a training step there
must dispatch none of the backward kernels that are nondeterministic on CUDA.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Iterator

import pytest
import torch
import torch.nn.functional as F
import torchvision
from torch import Tensor, nn
from torch.utils._python_dispatch import TorchDispatchMode

from models import layers_deform_conv
from models.layers_deform_attn import deform_attn
from models.layers_deform_conv import DCNv2PackFlowGuided, deform_conv3x3_sampled
from models.layers_warp import (
    deterministic_kernels,
    flow_warp,
    force_deterministic_kernels,
    grid_sample,
    grid_sample_backward,
    pad,
    pad_formulation,
    resize_bilinear,
    resize_bilinear_formulation,
)
from models.network_rvrt import RVRT
from models.network_vrt import VRT
from tests.support.golden import deterministic_fill

pytestmark = pytest.mark.usefixtures('one_thread')

# backward kernels that accumulate with atomic adds on CUDA (torch.use_deterministic_algorithms' "throws" list, as
# far as it concerns training, plus torchvision's deformable convolution, which does not raise)
NONDETERMINISTIC = re.compile(
    r'(grid_sampler_[23]d|upsample_\w+|reflection_pad[123]d|replication_pad[123]d|_deform_conv2d|avg_pool3d'
    r'|adaptive_avg_pool[23]d|adaptive_max_pool2d|fractional_max_pool[23]d)_backward|max_unpool|nll_loss|ctc_loss'
    r'|embedding_bag|histc|bincount|median|scatter_reduce|\.put_?$'
)


class OpRecorder(TorchDispatchMode):
    """Collects the names of the aten (and torchvision) ops dispatched while active, backward included."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: set[str] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.add(str(func.overloadpacket))
        return func(*args, **(kwargs or {}))

    def nondeterministic(self) -> list[str]:
        return sorted(op for op in self.ops if NONDETERMINISTIC.search(op))


@contextlib.contextmanager
def deterministic_algorithms() -> Iterator[None]:
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(False)


def _values_and_grads(fn: Callable[..., Tensor], inputs: list[Tensor], forced: bool | None) -> list[Tensor]:
    """fn's output and the gradients of a fixed random projection w.r.t. every input (zeros where none)."""
    ctx = contextlib.nullcontext() if forced is None else force_deterministic_kernels(forced)
    with ctx:  # backward inside too: checkpointed ops recompute their forward there
        leaves = [t.clone().requires_grad_() for t in inputs]
        out = fn(*leaves)
        out.backward(torch.randn(out.shape, generator=torch.Generator().manual_seed(7), dtype=out.dtype))
    return [out.detach()] + [t.grad if t.grad is not None else torch.zeros_like(t) for t in leaves]


def assert_same_op(ours: Callable[..., Tensor], default: Callable[..., Tensor], inputs: list[Tensor],
                   forced: bool | None = None, tol: float = 1e-6) -> None:
    """Values and gradients agree within ``tol`` times max(1, largest magnitude) of each result."""
    names = ['output'] + [f'grad of input {i}' for i in range(len(inputs))]
    for name, a, b in zip(names, _values_and_grads(ours, inputs, forced), _values_and_grads(default, inputs, None)):
        assert a.shape == b.shape, name
        err = (a - b).abs().max().item() if a.numel() else 0.0
        bound = tol * max(1.0, b.abs().max().item() if b.numel() else 0.0)
        assert err <= bound, f'{name}: max error {err:.2e} > {bound:.2e}'


# ---------------------------------------------------------------------------------------------------- switch
def test_switch_follows_deterministic_mode_off_the_cpu_and_can_be_forced() -> None:
    cpu, meta = torch.zeros(1), torch.zeros(1, device='meta')
    assert not deterministic_kernels(cpu) and not deterministic_kernels(meta)
    with deterministic_algorithms():
        assert not deterministic_kernels(cpu)  # the CPU kernels are deterministic already
        assert deterministic_kernels(meta)
        with force_deterministic_kernels(False):
            assert not deterministic_kernels(meta)
    with force_deterministic_kernels():
        assert deterministic_kernels(cpu)
    assert not deterministic_kernels(cpu)


# ------------------------------------------------------------------------------------------ single operations
SIZES = [(7, 9), (1, 5), (6, 1), (1, 1)]


def _grid(n: int, h: int, w: int, seed: int) -> Tensor:
    """Random normalised positions, about a sixth outside [-1, 1], some exactly on the borders and the centre."""
    grid = torch.rand(n, h, w, 2, generator=torch.Generator().manual_seed(seed)) * 2.6 - 1.3
    grid[:, 0, :2] = torch.tensor([[-1.0, 1.0], [1.0, -1.0]])
    grid[:, -1, -1] = 0.0
    return grid


@pytest.mark.parametrize('size', SIZES)
@pytest.mark.parametrize('align_corners', [True, False])
@pytest.mark.parametrize('padding_mode', ['zeros', 'border'])
@pytest.mark.parametrize('mode', ['bilinear', 'nearest'])
def test_grid_sample(mode: str, padding_mode: str, align_corners: bool, size: tuple) -> None:
    """The native forward (same bits) with the deterministic backward."""
    x = torch.randn(2, 3, *size, generator=torch.Generator().manual_seed(1))
    grid = _grid(2, 5, 4, seed=2)
    options = {'mode': mode, 'padding_mode': padding_mode, 'align_corners': align_corners}
    assert_same_op(lambda a, g: grid_sample(a, g, **options), lambda a, g: F.grid_sample(a, g, **options),
                   [x, grid], forced=True, tol=0.0 if mode == 'nearest' else 1e-6)


def test_grid_sample_backward_computes_only_what_is_asked() -> None:
    x, grid, grad_out = torch.randn(1, 2, 4, 5), _grid(1, 3, 3, seed=3), torch.randn(1, 2, 3, 3)
    grad_x, grad_grid = grid_sample_backward(x, grid, grad_out, input_grad=False)
    assert grad_x is None and grad_grid.shape == grid.shape
    grad_x, grad_grid = grid_sample_backward(x, grid, grad_out, 'nearest')
    assert grad_x.shape == x.shape and grad_grid is None


@pytest.mark.parametrize('size', SIZES + [(12, 16)])
@pytest.mark.parametrize(('interp_mode', 'padding_mode'),
                         [('bilinear', 'zeros'), ('bilinear', 'border'), ('nearest4', 'zeros'), ('nearest4', 'border')])
def test_flow_warp(interp_mode: str, padding_mode: str, size: tuple) -> None:
    gen = torch.Generator().manual_seed(3)
    x, flow = torch.randn(3, 4, *size, generator=gen), 3 * torch.randn(3, *size, 2, generator=gen)
    warp = lambda a, f: flow_warp(a, f, interp_mode, padding_mode)  # noqa: E731
    assert_same_op(warp, warp, [x, flow], forced=True)


def test_nearest4_passes_no_gradient_to_the_flow() -> None:
    flow = torch.randn(1, 6, 7, 2, requires_grad=True)
    for forced in (False, True):
        with force_deterministic_kernels(forced):
            flow_warp(torch.rand(1, 2, 6, 7, requires_grad=True), flow, 'nearest4').sum().backward()
    assert flow.grad is None  # the grid is detached: no grid_sample backward runs for it


@pytest.mark.parametrize('size', [(9, 11), (1, 6), (5, 1), (1, 1)])
@pytest.mark.parametrize(('k', 'groups'), [(1, 4), (2, 4)])
def test_sampled_deform_conv_equals_torchvision(k: int, groups: int, size: tuple) -> None:
    gen = torch.Generator().manual_seed(k + size[0])
    c = 8
    inputs = [torch.randn(2, k * c, *size, generator=gen), 3 * torch.randn(2, 18 * groups, *size, generator=gen),
              torch.rand(2, 9 * groups, *size, generator=gen), torch.randn(c, c, 3, 3, generator=gen) / 10,
              torch.randn(c, generator=gen)]

    def tv(x, o, m, wt, b):
        return torchvision.ops.deform_conv2d(x, o, wt, b, padding=(1, 1), mask=m)

    assert_same_op(deform_conv3x3_sampled, tv, inputs, forced=True)
    assert_same_op(deform_conv3x3_sampled, tv, inputs, forced=False)  # a size of 1 samples correctly too


@pytest.mark.parametrize('size', [(6, 7), (1, 5), (4, 1), (1, 1)])
def test_deform_attn(size: tuple) -> None:
    gen = torch.Generator().manual_seed(size[1])
    n, clip, c, groups, heads = 1, 2, 8, 4, 2
    inputs = [torch.randn(n * clip, 1, c, *size, generator=gen), torch.randn(n, clip, 2 * c, *size, generator=gen),
              2 * torch.randn(n * clip, clip * groups * 18, *size, generator=gen)]
    attn = lambda q, kv, off: deform_attn(q, kv, off, 3, 3, 1, 1, 1, heads, groups, clip)  # noqa: E731
    assert_same_op(attn, attn, inputs, forced=True, tol=5e-7)  # measured 8.9e-8


@pytest.mark.parametrize('size', [(1, 1), (1, 4), (3, 5), (8, 12)])
def test_resize_twice_with_aligned_corners(size: tuple) -> None:
    """SpyNet's flow upsampling: scale factor 2, align_corners=True."""
    x = torch.randn(2, 2, *size, generator=torch.Generator().manual_seed(4))
    options = {'scale_factor': 2, 'align_corners': True}
    interp = lambda a: F.interpolate(a, mode='bilinear', **options)  # noqa: E731
    assert_same_op(lambda a: resize_bilinear_formulation(a, **options), interp, [x])
    assert_same_op(lambda a: resize_bilinear(a, **options), interp, [x], forced=True)


@pytest.mark.parametrize(('size', 'out_size'), [((8, 12), (7, 13)), ((8, 12), (20, 27)), ((5, 3), (2, 9)),
                                                ((1, 1), (3, 4)), ((4, 6), (1, 1))])
def test_resize_to_size(size: tuple, out_size: tuple) -> None:
    """SpyNet's output flows: an explicit size, align_corners=False."""
    x = torch.randn(2, 2, *size, generator=torch.Generator().manual_seed(5))
    options = {'size': out_size, 'align_corners': False}
    interp = lambda a: F.interpolate(a, mode='bilinear', **options)  # noqa: E731
    assert_same_op(lambda a: resize_bilinear_formulation(a, **options), interp, [x])
    assert_same_op(lambda a: resize_bilinear(a, **options), interp, [x], forced=True)


@pytest.mark.parametrize(('mode', 'pads', 'size'), [
    ('replicate', (0, 0, 0, 1), (5, 6)), ('replicate', (0, 1, 0, 0), (5, 6)), ('replicate', (2, 3, 1, 4), (1, 1)),
    ('reflect', (3, 3, 3, 3), (6, 5)), ('reflect', (1, 2, 0, 3), (4, 4)),
])
def test_pad(mode: str, pads: tuple, size: tuple) -> None:
    x = torch.randn(2, 3, *size, generator=torch.Generator().manual_seed(6))
    # measured: 9.6e-8
    assert_same_op(lambda a: pad_formulation(a, pads, mode), lambda a: F.pad(a, pads, mode=mode), [x], tol=5e-7)
    assert_same_op(lambda a: pad(a, pads, mode), lambda a: F.pad(a, pads, mode=mode), [x], forced=True, tol=5e-7)


def test_deform_offsets_are_fp32_under_autocast(monkeypatch: pytest.MonkeyPatch) -> None:
    """tanh, the residue scale and the flow addition run in fp32 even when conv_offset runs in bf16."""
    torch.manual_seed(0)
    dcn = DCNv2PackFlowGuided(8, deformable_groups=2, pa_frames=2)
    deterministic_fill(dcn, seed=1)
    raw, seen = [], []
    dcn.conv_offset[-1].register_forward_hook(lambda m, i, out: raw.append(out))
    monkeypatch.setattr(layers_deform_conv, 'deform_conv3x3_sampled', lambda *args: seen.append(args[1]) or args[0])
    gen = torch.Generator().manual_seed(2)
    neighbours, warped, current = (torch.rand(2, 8, 6, 7, generator=gen) for _ in range(3))
    flows = 3 * torch.randn(2, 2, 6, 7, generator=gen)
    with torch.no_grad(), torch.autocast('cpu', dtype=torch.bfloat16):
        dcn(neighbours, warped, current, flows)
    assert raw[0].dtype == torch.bfloat16 and seen[0].dtype == torch.float32
    o1, o2, _ = torch.chunk(raw[0], 3, dim=1)
    expected = dcn.max_residue_magnitude * torch.tanh(torch.cat((o1, o2), dim=1).float())
    expected = (expected.view(2, 1, -1, 2, 6, 7) + flows.view(2, 1, 1, 2, 6, 7).flip(3)).view(2, -1, 6, 7)
    torch.testing.assert_close(seen[0], expected, atol=0, rtol=0)


# ------------------------------------------------------------------------------------------------- networks
VRT_TINY = {'depths': (1,) * 7 + (1, 1), 'embed_dims': (8,) * 9, 'num_heads': (1,) * 9, 'indep_reconsts': (8,),
            'window_size': (2, 4, 4), 'drop_path_rate': 0.0, 'deformable_groups': 4, 'mlp_ratio': 1.0}
RVRT_TINY = {'clip_size': 2, 'window_size': (2, 4, 4), 'num_blocks': (1, 1, 1), 'depths': (1, 1, 1),
             'embed_dims': (8, 8, 8), 'num_heads': (1, 1, 1), 'inputconv_groups': (1,) * 6, 'deformable_groups': 4,
             'attention_heads': 2, 'mlp_ratio': 1.0}
NETWORKS = {
    # name: (constructor, input shape, a nondeterministic backward the default run dispatches on the CPU)
    'vrt_pa2_x4': (lambda: VRT(**VRT_TINY, img_size=(2, 40, 40)), (1, 2, 3, 40, 40), 'grid_sampler_2d_backward'),
    'vrt_pa4_x4': (lambda: VRT(**VRT_TINY, img_size=(3, 40, 40), pa_frames=4), (1, 3, 3, 40, 40),
                   'upsample_bilinear2d_backward'),
    'vrt_interpolation': (lambda: VRT(**VRT_TINY, upscale=1, pa_frames=0, img_size=(2, 32, 32)), (1, 2, 3, 32, 32),
                          'reflection_pad2d_backward'),
    'rvrt_x4': (lambda: RVRT(**RVRT_TINY), (1, 4, 3, 36, 36), 'grid_sampler_2d_backward'),
}


def _training_step(net: nn.Module, x: Tensor, forced: bool | None) -> tuple[Tensor, dict[str, Tensor], OpRecorder]:
    net.zero_grad(set_to_none=True)
    ctx = contextlib.nullcontext() if forced is None else force_deterministic_kernels(forced)
    with ctx, OpRecorder() as recorder:
        out = net(x)
        out.square().mean().backward()
    return out.detach(), {n: p.grad for n, p in net.named_parameters() if p.grad is not None}, recorder


@pytest.mark.parametrize('name', sorted(NETWORKS))
def test_networks_same_with_formulations_on_and_off(name: str) -> None:
    """Same output bits (the forward is the native kernels' in both runs) and parameter gradients within 5e-6 of
    each tensor's largest entry, or of 1% of the network's largest entry for tensors with smaller gradients
    (measured: at most 5.1e-7 of that, VRT's interpolation; about 10x for other CPUs' summation orders); the run
    with the formulations dispatches none of the nondeterministic backward kernels that the default run
    dispatches."""
    make, shape, seen_by_default = NETWORKS[name]
    torch.manual_seed(0)
    net = make().train()
    deterministic_fill(net, seed=3)  # non-zero offset convolutions: the offsets are not just the flows
    x = torch.rand(shape, generator=torch.Generator().manual_seed(1))
    out_off, grads_off, rec_off = _training_step(net, x, False)
    out_on, grads_on, rec_on = _training_step(net, x, True)
    assert torch.equal(out_on, out_off)
    assert grads_on.keys() == grads_off.keys() and len(grads_off) == len(list(net.parameters()))
    largest = max(g.abs().max().item() for g in grads_off.values())
    for pname, g_off in grads_off.items():
        bound = 5e-6 * max(g_off.abs().max().item(), 1e-2 * largest)
        err = (grads_on[pname] - g_off).abs().max().item()
        assert err <= bound, f'{pname}: gradient differs by {err:.2e} > {bound:.2e}'
    assert rec_on.nondeterministic() == []
    assert f'aten.{seen_by_default}' in rec_off.nondeterministic()  # the recorder does see them


@pytest.mark.parametrize('name', ['vrt_pa4_x4', 'vrt_interpolation', 'rvrt_x4'])
def test_meta_training_step_dispatches_no_nondeterministic_backward(name: str,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Deterministic mode on a device that is not the CPU: the switch turns itself on."""
    # torch.equal (the mirrored-input check) has no meta kernel
    monkeypatch.setattr(RVRT, 'is_mirror_extended', staticmethod(lambda lqs: False))
    make, shape, _ = NETWORKS[name]
    with torch.device('meta'):
        net = make().train()
    with deterministic_algorithms():
        _, grads, recorder = _training_step(net, torch.rand(shape, device='meta'), None)
    assert grads and 'aten.convolution_backward' in recorder.ops
    assert recorder.nondeterministic() == []


def test_meta_default_kernels_are_seen() -> None:
    """With the switch forced off, the same meta step dispatches grid_sample's and torchvision's backward."""
    make, shape, _ = NETWORKS['vrt_pa4_x4']
    with torch.device('meta'):
        net = make().train()
    with deterministic_algorithms():
        _, _, recorder = _training_step(net, torch.rand(shape, device='meta'), False)
    assert {'aten.grid_sampler_2d_backward', 'torchvision._deform_conv2d_backward'} <= set(recorder.nondeterministic())
