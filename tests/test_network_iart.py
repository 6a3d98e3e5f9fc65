"""IART network tests: the official implementation's state-dict layout, outputs and gradients, and what IART eats.

Fixtures in tests/fixtures/iart/ were made by ``scripts/reference/make_iart_fixtures.py`` running the official code
(github.com/kai422/IART, patched only to run on the CPU) on tiny configurations whose weights come from
``deterministic_fill`` (a pure function of a seed) and whose inputs are seeded: ``state_dict_shapes.json.gz`` (the
constructor defaults and the released models' constructor), ``golden_<case>.pt`` (output, input gradient and parameter
gradients; see the script's docstring for the cases).
"""

from __future__ import annotations

import dataclasses
import os
import re
from pathlib import Path

import pytest
import torch
from torch import Tensor

import models.network_iart as iart_mod
from engine import evaluate
from models.layers_sdpa import record_attention_calls
from models.memory_plan import cpu_tile
from models.model_zoo import IART_AUTHOR_FOLDER, TASKS, ModelZooError
from models.net_io import net_io
from models.network_iart import IART, MIN_LQ_SIZE, PropagationTransformer
from tests.support.golden import assert_same_layout, deterministic_fill, shape_table
from utils.utils_image import imwrite_rgb

FIXTURES = Path(__file__).parent / 'fixtures' / 'iart'
CASES = ('second_order', 'mirror', 'cache')
# fp32 output atol: measured against the official at one thread (Intel Xeon, AVX-512): 6.0e-8 in all three cases; an
# AVX2 machine rounds its kernels differently (other families measured up to 4x more there), hence 2e-6, still 5x
# inside the 1e-5 the issue asks for. float64: measured 1.1e-16.
OUT_ATOL = 2e-6
STATS_ATOL = 1e-6
FP64_ATOL = 1e-12
# gradient tolerances relative to each tensor's largest entry. Measured against the official (fp32 both, Intel Xeon,
# one thread): input 3.4e-5; SpyNet 2.3e-4 (sums of cancelling terms through bilinear sampling); the relative-position
# bias tables of shifted blocks 2.0e-4 (summed over windows in another order), the rest below; each against the exact
# (our fp64) gradient: SpyNet 3.7e-4, input 8.5e-5, the rest 1e-4. Tolerances about 3x the measured differences.
GRAD_REL = {'spynet': 1.5e-3, 'input': 4e-4, 'other': 6e-4}
# the gradient of the keys' bias is zero in exact arithmetic (softmax ignores a shift shared by all keys): rounding
# noise of 1e-22 whose relative size means nothing
EXACT_ZERO = ('implicit_warp.k.bias',)

pytestmark = pytest.mark.usefixtures('one_thread')


def _golden(case: str) -> dict:
    return torch.load(FIXTURES / f'golden_{case}.pt', weights_only=True)


def _case_input(data: dict) -> Tensor:
    """The fixture script's input: seeded uniform frames drawn in the case's dtype, mirrored where the case says."""
    x = torch.rand(data['shape'], generator=torch.Generator().manual_seed(data['seed']),
                   dtype=getattr(torch, data['dtype']))
    if data['mirror']:
        x = torch.cat([x, x.flip(1)], dim=1)
    return x


def _case_net(data: dict) -> IART:
    torch.manual_seed(0)
    net = IART(**data['config'], cpu_cache_length=data['cache'])
    deterministic_fill(net, data['fill_seed'], gain=data['fill_gain'])
    net._force_cpu_cache = data['cache'] < data['shape'][1]  # the official's cache mode ran on the CPU too
    return net.to(getattr(torch, data['dtype'])).eval()


def _tiny(**kwargs) -> IART:
    torch.manual_seed(0)
    net = IART(**{'mid_channels': 8, 'embed_dim': 8, 'depths': [1], 'num_heads': [2], 'window_size': [3, 4, 4],
                  'use_checkpoint': False, 'drop_path_rate': 0.0, **kwargs})
    deterministic_fill(net, 1, gain=0.5)
    return net


@pytest.mark.parametrize('name', sorted(shape_table(FIXTURES)))
def test_state_dict_keys_and_shapes_match_official(name: str) -> None:
    assert_same_layout(IART, shape_table(FIXTURES)[name])


@pytest.mark.parametrize('case', CASES)
def test_golden_matches_official(case: str) -> None:
    """Same weights and input as the official run: the same output (fp32 rounding) and gradients (measured
    tolerances); the official's cache mode (``cpu_cache_length`` below the clip) against ours forced on the CPU."""
    data = _golden(case)
    net = _case_net(data)
    x = _case_input(data).requires_grad_()
    out = net(x)
    s = data['step']
    torch.testing.assert_close(out.detach()[..., ::s, ::s], data['output_sub'], atol=OUT_ATOL, rtol=0)
    for stat, value in (('output_mean', out.mean()), ('output_abs_mean', out.abs().mean()),
                        ('loss', out.square().mean())):
        assert abs(value.item() - data[stat]) <= STATS_ATOL, stat
    out.square().mean().backward()
    err = (x.grad[..., ::s, ::s] - data['input_grad_sub']).abs().max() / data['input_grad_scale']
    assert err <= GRAD_REL['input'], f'{case}: input gradient differs by {err:.2e} of its largest entry'
    params = dict(net.named_parameters())
    # the same parameters learn: all that require a gradient get one (DDP without find_unused_parameters needs that)
    assert {k for k, p in params.items() if p.grad is not None} == set(data['grads']) == \
        {k for k, p in params.items() if p.requires_grad}
    for name, rec in data['grads'].items():
        if name in EXACT_ZERO:
            continue
        ours = params[name].grad.flatten()[::rec['stride']]
        err = (ours - rec['values']).abs().max() / rec['scale']
        rel = GRAD_REL['spynet' if name.startswith('spynet.') else 'other']
        assert err <= rel, f'{case}: gradient of {name} differs by {err:.2e} of its largest entry'


def test_golden_fp64_matches_official() -> None:
    data = _golden('fp64')
    net = _case_net(data)
    with torch.no_grad():
        out = net(_case_input(data))
    s = data['step']
    torch.testing.assert_close(out[..., ::s, ::s], data['output_sub'], atol=FP64_ATOL, rtol=0)
    assert abs(out.mean().item() - data['output_mean']) <= FP64_ATOL
    assert abs(out.square().mean().item() - data['loss']) <= FP64_ATOL


def test_unused_parameters_need_no_gradient() -> None:
    """The official builds convolutions it never runs; they keep their names but do not require gradients, so DDP
    needs no find_unused_parameters (the golden tests check that every other parameter gets a gradient, as the
    official's do)."""
    net = _tiny(embed_dim=12, num_heads=[2])
    frozen = {k for k, p in net.named_parameters() if not p.requires_grad}
    assert frozen == {f'swin_backbone.{b}.{m}.{w}' for b in iart_mod.BRANCHES
                      for m in ('conv_first', 'conv_first_feat', 'conv_before_upsample') for w in ('weight', 'bias')}
    sixty_four = PropagationTransformer(3, 64, [1], [2], [3, 4, 4])
    assert sixty_four.conv_first_feat.weight.requires_grad  # the official runs it on 64-channel features


def test_training_keeps_no_attention_matrix_and_one_copy_of_each_high_resolution_activation() -> None:
    """What a train step holds for backward (benchmarks/RESULTS.md, IART: at most the official's peak memory): every
    window attention goes through the fused kernel with the recomputing bias backward (no (windows x heads x N x N)
    probabilities kept), and the head's activations run in place (its four 64-channel high-resolution tensors kept
    as two, as the official's in-place LeakyReLU does)."""
    net = _tiny().train()
    x = torch.rand(1, 1, 3, 64, 64, generator=torch.Generator().manual_seed(8), requires_grad=True)
    with record_attention_calls() as calls:
        net(x)
    assert len(calls) == 4 and {c['path'] for c in calls} == {'biased'}  # 4 branches x 1 frame x 1 block

    saved: dict[int, int] = {}

    def pack(t: Tensor) -> Tensor:
        saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        net._head(torch.randn(1, 8, 64, 64, requires_grad=True), torch.rand(1, 3, 64, 64))
    high_res = 64 * 256 * 256 * 4  # one (1, 64, 256, 256) fp32 tensor
    assert 2 * high_res <= sum(saved.values()) < 3 * high_res, sum(saved.values()) / high_res


def test_io_and_input_checks() -> None:
    net = _tiny()
    io = net_io(net)
    assert (io.scale, io.in_chans, io.min_size, io.temporal_tile, io.temporal_overlap) == (4, 3, MIN_LQ_SIZE, 100, 10)
    with torch.no_grad():
        assert net(torch.rand(1, 1, 3, 64, 70)).shape == (1, 1, 3, 256, 280)  # one frame: no alignment
    for shape, words in (((1, 2, 3, 63, 80), 'at least 64x64 .* got 63x80: pad the frames to at least 64x80'),
                         ((1, 2, 4, 64, 64), '3 input channels'), ((2, 64, 64), r'\(N, T, C, H, W\)')):
        with pytest.raises(ValueError, match=words) as info:
            net(torch.rand(shape))
        assert '\n' not in str(info.value)
    for kwargs, words in (({'is_low_res_input': False}, 'x4 super-resolution'), ({'in_channels': 4}, 'must be 3'),
                          ({'embed_dim': 10, 'num_heads': [2]}, 'divisible by 4'),
                          ({'num_frames': 4}, 'num_frames 4 with window_size.0. 3'),
                          ({'use_checkpoint': [True, False]}, 'one flag per branch')):
        with pytest.raises(ValueError, match=words):
            _tiny(**kwargs)


def test_clip_lengths_and_tiles_are_checked_before_any_work() -> None:
    net = _tiny()
    net.check_clip_lengths([('a', 3), ('b', 100)], {'size_patch_testing': 0})
    net.check_clip_lengths([('a', 3)], {'size_patch_testing': 64})
    with pytest.raises(ValueError, match=r'^--tile: tiles of 48x48 LQ pixels, but IART needs at least 64x64'):
        net.check_clip_lengths([('a', 3)], {'size_patch_testing': 48})
    with pytest.raises(ValueError, match=r'^clip b has 2 frame\(s\), fewer than the 3 IART attends over'):
        net.check_clip_lengths([('a', 5), ('b', 2)], {'size_patch_testing': 0})


def test_mirror_flag_is_per_forward_and_a_mirrored_clip_runs_spynet_once() -> None:
    """The official keeps the mirror flag once set (every later clip then reuses backward flows); here a plain clip
    after a mirrored one gives what it gives alone, and a mirrored clip computes one flow direction only."""
    net = _tiny().eval()
    g = torch.Generator().manual_seed(3)
    half = torch.rand(1, 2, 3, 64, 64, generator=g)
    plain = torch.rand(1, 3, 3, 64, 64, generator=g)
    pairs = []
    net.spynet.register_forward_hook(lambda m, args, out: pairs.append(args[0].shape[0]))
    with torch.no_grad():
        expected = net(plain)
        net(torch.cat([half, half.flip(1)], dim=1))
        torch.testing.assert_close(net(plain), expected, atol=0, rtol=0)
    assert pairs == [4, 3, 4]  # both directions of 2 pairs, one direction of 3 pairs


def _cached_and_plain(net: IART, x: Tensor) -> list[tuple[Tensor, Tensor, dict]]:
    results = []
    for cached in (False, True):
        net.cpu_cache_length, net._force_cpu_cache = (x.shape[1] - 1, True) if cached else (x.shape[1], False)
        net.zero_grad()
        xi = x.clone().requires_grad_()
        out = net(xi)
        out.square().mean().backward()
        results.append((out.detach().cpu(), xi.grad.cpu(), {k: p.grad.cpu() for k, p in net.named_parameters()
                                                            if p.grad is not None}))
    return results


def test_cpu_cache_mode_trains_and_equals_the_plain_forward(monkeypatch) -> None:
    """Cache mode forced on the CPU (its moves are no-ops there, every other step runs: features and SpyNet in chunks
    of 2 frames, features kept on the store) in training equals the plain forward up to the rounding of the other
    batch sizes (measured: output 1.2e-7; input gradient 6.6e-5 of its largest entry, through SpyNet; parameter
    gradients 2e-4 of their largest entry in SpyNet, which sums over the chunks in another order)."""
    net = _tiny()
    monkeypatch.setattr(iart_mod, 'CACHE_CHUNK_PIXELS', 2 * 64 * 64)
    x = torch.rand(1, 3, 3, 64, 64, generator=torch.Generator().manual_seed(4))
    (out, x_grad, grads), (c_out, c_x_grad, c_grads) = _cached_and_plain(net, x)
    torch.testing.assert_close(c_out, out, atol=1e-6, rtol=0)
    torch.testing.assert_close(c_x_grad, x_grad, atol=5e-4 * x_grad.abs().max().item(), rtol=0)
    assert grads.keys() == c_grads.keys()
    for name, grad in grads.items():
        if name not in EXACT_ZERO:
            tol = (1e-3 if name.startswith('spynet.') else 1e-4) * grad.abs().max().item()
            torch.testing.assert_close(c_grads[name], grad, atol=tol, rtol=0, msg=name)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason='needs a CUDA device')
def test_cpu_cache_mode_on_a_gpu() -> None:
    """The real thing: features and flows kept on the CPU, computation on the GPU, the output on the GPU."""
    net = _tiny().cuda()
    x = torch.rand(1, 4, 3, 64, 64, generator=torch.Generator().manual_seed(4)).cuda()
    stored = []
    real = net.propagate
    net.propagate = lambda feats, *a: stored.append(feats[0].device) or real(feats, *a)
    (out, x_grad, grads), (c_out, c_x_grad, c_grads) = _cached_and_plain(net, x)
    assert [d.type for d in stored] == ['cuda'] * 4 + ['cpu'] * 4
    torch.testing.assert_close(c_out, out, atol=1e-5, rtol=0)
    torch.testing.assert_close(c_x_grad, x_grad, atol=1e-6, rtol=0)
    for name, grad in grads.items():
        if name not in EXACT_ZERO:  # zero but for rounding, which the two orders of summation make differently
            torch.testing.assert_close(c_grads[name], grad, atol=1e-3 * grad.abs().max().item(), rtol=0, msg=name)
    net.cpu_cache_length = 1
    with torch.no_grad():
        assert net(x).device == x.device


def test_checkpointing_is_non_reentrant_and_changes_nothing(monkeypatch) -> None:
    net = _tiny(depths=[2], num_heads=[2])
    x = torch.rand(1, 2, 3, 64, 64, generator=torch.Generator().manual_seed(5))
    runs, calls = [], []
    real = iart_mod.checkpoint
    monkeypatch.setattr(iart_mod, 'checkpoint', lambda *a, **k: calls.append(k) or real(*a, **k))
    for flags in (False, [True, False, True, True]):
        for branch, flag in zip(net.swin_backbone.values(), flags if isinstance(flags, list) else [flags] * 4):
            for layer in branch.layers:
                layer.residual_group.use_checkpoint = flag
        net.zero_grad()
        net(x).square().mean().backward()
        runs.append({k: p.grad.clone() for k, p in net.named_parameters() if p.grad is not None})
    assert len(calls) == 3 * 2 * 2 and all(k == {'use_reentrant': False} for k in calls)  # 3 branches x 2 frames x 2
    for name in runs[0]:
        torch.testing.assert_close(runs[1][name], runs[0][name], atol=0, rtol=0, msg=name)


def test_bf16_autocast_keeps_flows_and_sampling_positions_fp32() -> None:
    net = _tiny().eval()
    x = torch.rand(1, 3, 3, 64, 64, generator=torch.Generator().manual_seed(6))
    seen = []
    for conv in (net.spynet.basic_module[0].basic_module[0], net.spynet.basic_module[5].basic_module[8]):
        conv.register_forward_hook(lambda m, args, out: seen.append((args[0].dtype, out.dtype)))
    with torch.no_grad():
        full = net(x)
        with torch.autocast('cpu', dtype=torch.bfloat16):
            half = net(x)
    assert len(seen) == 4 and set(seen) == {(torch.float32, torch.float32)}  # SpyNet's convolutions run in fp32
    assert torch.isfinite(half).all() and (half.float() - full).abs().mean() < 5e-3  # 9.6e-4 measured


def test_missing_spynet_file_is_an_error(tmp_path) -> None:
    with pytest.raises(FileNotFoundError, match='spynet'):
        IART(embed_dim=8, depths=[1], num_heads=[2], spynet_path=str(tmp_path / 'spynet.pth'))


# ----------------------------------------------------------------------------------------------- released models
def test_model_zoo_names_the_authors_folder(tmp_path) -> None:
    names = [name for name, spec in TASKS.items() if spec.net_type == 'iart']
    assert names == ['IART_REDS_BI_N6', 'IART_REDS_BI_N16', 'IART_Vimeo-90K_BI', 'IART_Vimeo-90K_BD']
    for name in names:
        spec = TASKS[name]
        assert spec.url == '' and spec.published_in == IART_AUTHOR_FOLDER and spec.tile == (0, 0, 0)
        assert spec.default_model_path == os.path.join('model_zoo', 'iart', f'{name}.pth')
        assert spec.net_kwargs() == shape_table(FIXTURES)['released']['kwargs']
    with pytest.raises(ModelZooError, match=re.escape(f'Download IART_REDS_BI_N16.pth from {IART_AUTHOR_FOLDER}')) \
            as info:
        TASKS['IART_REDS_BI_N16'].check_model_file(str(tmp_path / 'IART_REDS_BI_N16.pth'))
    assert '\n' not in str(info.value)


@pytest.fixture(scope='module')
def released_file(tmp_path_factory) -> Path:
    """A ``{'params': ...}`` file of the released constructor (random weights), as the authors' files hold."""
    path = tmp_path_factory.mktemp('zoo') / 'IART_mine.pth'
    with torch.device('meta'):
        shapes = IART(**TASKS['IART_REDS_BI_N6'].net_kwargs()).state_dict()
    gen = torch.Generator().manual_seed(0)
    sd = {k: (0.02 * torch.randn(v.shape, generator=gen) if v.is_floating_point() else torch.zeros(v.shape,
                                                                                                  dtype=v.dtype))
          for k, v in shapes.items()}
    torch.save({'params': sd}, path)
    return path


def _clip(root: Path, frames: int, size: int) -> tuple[str, str]:
    g = torch.Generator().manual_seed(1)
    for t in range(frames):
        lq = torch.rand(3, size, size, generator=g)
        imwrite_rgb(str(root / 'lq' / 'clip' / f'{t:08d}.png'), lq)
        imwrite_rgb(str(root / 'gt' / 'clip' / f'{t:08d}.png'), torch.nn.functional.interpolate(
            lq[None], scale_factor=4, mode='bilinear', align_corners=False)[0].clamp(0, 1))
    return str(root / 'lq'), str(root / 'gt')


def test_released_file_loads_strictly_through_the_task(released_file, monkeypatch, tmp_path) -> None:
    monkeypatch.chdir(tmp_path)
    args = evaluate.build_parser().parse_args(['--task', 'IART_REDS_BI_N6', '--model_path', str(released_file)])
    setup = evaluate.setup_model(args)
    # whole clips and frames, capped on the CPU (models/memory_plan.py::cpu_tile) to tiles of at least 64 pixels
    assert isinstance(setup.net, IART) and setup.tile == cpu_tile((0, 0), setup.io) and setup.io.min_size == 64
    assert setup.tile[1] >= MIN_LQ_SIZE
    saved = torch.load(released_file, weights_only=True)['params']
    ours = setup.net.state_dict()
    for key in ('implicit_warp.position_bias', 'swin_backbone.forward_2.layers.2.residual_group.blocks.5.attn.'
                'relative_position_bias_table', 'spynet.basic_module.5.basic_module.8.weight', 'conv_last.bias'):
        assert torch.equal(ours[key], saved[key]), key


@pytest.mark.parametrize('bad', ['training_state', 'small_tile', 'short_clip', 'small_frames'])
def test_bad_input_is_one_line_and_exit_2(bad, tmp_path, monkeypatch, caplog) -> None:
    """A BasicSR training state for weights, tiles below 64x64, a clip of fewer than num_frames frames (all three
    before any work) and frames below 64x64: one ``error:`` line naming what is expected (and the file or clip),
    exit 2, no output. The task's constructor is made tiny (the released one takes seconds to build)."""
    monkeypatch.chdir(tmp_path)
    tiny = {'mid_channels': 8, 'embed_dim': 8, 'depths': [1], 'num_heads': [2], 'window_size': [3, 4, 4]}
    monkeypatch.setitem(TASKS, 'IART_REDS_BI_N6', dataclasses.replace(TASKS['IART_REDS_BI_N6'], kwargs=tiny))
    model = str(tmp_path / 'tiny.pth')
    torch.save({'params': _tiny(**tiny).state_dict()}, model)
    lq, gt = _clip(tmp_path / 'clips', 2 if bad == 'short_clip' else 3, 48 if bad == 'small_frames' else 64)
    extra = ['--tile', '0', '48', '48'] if bad == 'small_tile' else []
    if bad == 'training_state':  # what BasicSR writes to training_states/<iter>.state
        model = str(tmp_path / '300000.state')
        torch.save({'epoch': 12, 'iter': 300000, 'optimizers': [{'state': {}, 'param_groups': [{'lr': 1e-4}]}],
                    'schedulers': [{'last_epoch': 300000}]}, model)
    save = tmp_path / 'results'
    code = evaluate.main(['--task', 'IART_REDS_BI_N6', '--model_path', model, '--folder_lq', lq, '--folder_gt', gt,
                          *extra, '--device', 'cpu', '--num_workers', '0', '--save_dir', str(save)])
    errors = [r.getMessage() for r in caplog.records if r.getMessage().startswith('error: ')]
    assert code == 2 and len(errors) == 1 and '\n' not in errors[0], errors
    expected = {'training_state': f"{model} holds no state dict of tensors (expected {{'params': state_dict}})",
                'small_tile': '--tile: tiles of 48x48 LQ pixels, but IART needs at least 64x64',
                'short_clip': 'clip clip has 2 frame(s), fewer than the 3 IART attends over',
                'small_frames': 'IART needs low-resolution frames of at least 64x64 (the official asserts it), got '
                                '48x48'}[bad]
    assert expected in errors[0]
    assert not list(save.rglob('*.png')) and not (save / 'metrics.csv').exists()


def test_vimeo90k_t_runs_the_seven_frames_as_the_official_script(tmp_path, monkeypatch) -> None:
    """IART's official Vimeo-90K-T script runs a septuplet's 7 frames as they are and scores the centre one (index 3,
    im4); VRT's pads them to 8 for its 8-frame windows. The rule is the network's temporal padding multiple
    (``NetIO.input_multiple``): IART takes any number of frames, VRT's window does not."""
    from data import select_dataset
    from engine import eval_setup

    g = torch.Generator().manual_seed(7)
    for n in range(1, 8):
        imwrite_rgb(str(tmp_path / 'vimeo' / 'BIx4' / '00001' / '0001' / f'im{n}.png'),
                    torch.rand(3, 64, 64, generator=g))
        imwrite_rgb(str(tmp_path / 'vimeo' / 'GT' / '00001' / '0001' / f'im{n}.png'),
                    torch.rand(3, 256, 256, generator=g))
    meta = tmp_path / 'meta_info_Vimeo90K_test_GT.txt'
    meta.write_text('00001/0001 (256,448,3)\n')
    monkeypatch.setattr(select_dataset, 'VIMEO_META', str(meta))
    args = evaluate.build_parser().parse_args(['--folder_lq', str(tmp_path / 'vimeo' / 'BIx4'),
                                               '--folder_gt', str(tmp_path / 'vimeo' / 'GT')])
    net = _tiny().eval()
    setup = eval_setup.TestSetup(name='iart', net=net, io=net.io, tile=(0, 0), tile_overlap=(10, 20),
                                 vimeo_mirror=False, sigma=0)
    item = eval_setup.build_test_set(args, setup)[0]
    assert item['L'].shape == (7, 3, 64, 64)
    out = eval_setup.restore_clip(setup, item, torch.device('cpu'), None, vimeo=True)
    with torch.no_grad():
        expected = net(item['L'][None])[0, 3:4]
    torch.testing.assert_close(out, expected, atol=0, rtol=0)
    vrt_like = dataclasses.replace(setup, io=dataclasses.replace(net.io, input_multiple=(8, 8, 8)))
    assert eval_setup.build_test_set(args, vrt_like)[0]['L'].shape[0] == 8  # the last frame repeated, as VRT's


# ----------------------------------------------------------------------------------------------- recipes
def test_recipes_carry_the_official_settings_and_plan() -> None:
    """The official settings and the training clip the planner reads from each recipe; one estimate, on 3-frame clips
    (the meta pass costs about 1 s per frame of IART here, and the four recipes give the planner the same network,
    precision and batch: only their clips differ; RESULTS.md has each recipe's plan at its own clip)."""
    from engine.options import parse_options
    from models.memory_plan import estimate_peak_memory, train_clip

    recipes = sorted((Path(__file__).parents[1] / 'options' / 'iart').glob('*.json'))
    assert [p.name[:3] for p in recipes] == ['001', '002', '003', '004']
    first = None
    for path in recipes:
        opt = parse_options(str(path), ['netG.spynet_path=null'])
        train, data = opt['train'], opt['datasets']['train']
        vimeo = 'vimeo' in path.name
        assert (train['G_optimizer_lr'], train['fix_lr_mul']) == ((1e-4, 0.25) if vimeo else (2e-4, 0.125))
        # the official fix_flow: 5000 (REDS); -1 (Vimeo), which its model reads as frozen for the whole run
        assert train['fix_iter'] == (train['total_iter'] + 1 if vimeo else 5000) and train['fix_keys'] == ['spynet']
        assert train['total_iter'] == train['G_scheduler_periods'] == (600000 if '16frames' in path.name else 300000)
        assert (train['E_decay'], train['G_scheduler_eta_min'], train['G_optimizer_betas']) == (0.999, 1e-7,
                                                                                                [0.9, 0.99])
        assert (train['amp'], train['G_charbonnier_eps'], data['dataloader_batch_size'], data['gt_size']) == (
            'bf16', 1e-12, 8, 256)
        assert data['num_frame'] == (7 if vimeo else 6 if '_6frames' in path.name else 16)
        assert data.get('mirror_sequence', False) == vimeo
        assert opt['path']['pretrained_netG'] == ('model_zoo/iart/IART_REDS_BI_N16.pth' if vimeo else None)
        assert {k: v for k, v in opt['netG'].items() if k in TASKS['IART_REDS_BI_N6'].kwargs} == \
            TASKS['IART_REDS_BI_N6'].kwargs
        frames = 14 if vimeo else data['num_frame']
        assert train_clip(opt) == ((frames, 3, 64, 64), (frames, 3, 256, 256))
        planned = (opt['netG'], train['amp'], data['dataloader_batch_size'])
        first = first or planned
        assert planned == first, path.name
    estimate = estimate_peak_memory(opt, 'cuda', micro_batch=1, clip=((3, 3, 64, 64), (3, 3, 256, 256)))
    assert estimate.precision == 'bf16' and 0 < estimate.activations < estimate.total


# ----------------------------------------------------------------------------------------------- as a GAN generator
def test_real_world_gan_training_with_iart_as_the_generator(tmp_path, monkeypatch) -> None:
    """ModelGAN (KAIR's keys) with a tiny IART generator on real-world data: a synthetic H.264 video degraded on the
    fly by the realbasicvsr preset; D alone at step 1, then G and D (with EMA), validation, in process."""
    import main_train_vrt
    from tests.support.helpers import TINY_OPT, write_opt

    for key in ('RANK', 'LOCAL_RANK', 'WORLD_SIZE'):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.chdir(tmp_path)
    videos = str(tmp_path / 'videos')
    net = {'net_type': 'iart', 'mid_channels': 8, 'embed_dim': 8, 'depths': [1], 'num_heads': [2],
           'window_size': [3, 4, 4], 'use_checkpoint': False, 'spynet_path': None}
    train_set = {'name': 'train_dataset', 'dataset_type': 'VideoFileTrainDataset', 'dataroot_gt': videos,
                 'synthesize_if_missing': {'root': videos, 'num_videos': 1, 'num_frames': 4, 'size': [256, 256],
                                           'seed': 1},
                 'num_frame': 2, 'gt_size': 256, 'clips_per_video': 2, 'degradations': 'realbasicvsr',
                 'dataloader_num_workers': 0, 'dataloader_batch_size': 1}
    test_set = {**TINY_OPT['datasets']['test'], 'lq_size': [64, 64], 'num_clips': 1}
    opt = write_opt(tmp_path, base={**TINY_OPT, 'model': 'gan', 'datasets': {'train': train_set, 'test': test_set}},
                    netG=net, netD={'net_type': 'discriminator_unet', 'base_nc': 4},
                    train={'total_iter': 2, 'checkpoint_save': 1, 'checkpoint_test': 2, 'D_init_iters': 1,
                           'F_lossfn_weight': 0, 'E_decay': 0.9, 'D_optimizer_reuse': True})
    assert main_train_vrt.main(['--opt', opt, '--set', 'task=gan']) == 0
    models = tmp_path / 'experiments' / 'gan' / 'models'
    assert {p.name for p in models.iterdir()} >= {'2_G.pth', '2_E.pth', '2_D.pth', '2_optimizerD.pth', '2_state.pth'}
    log = (tmp_path / 'experiments' / 'gan' / 'train.log').read_text()
    assert 'LQ from degradations' in log and 'Average PSNR' in log
    g1, g2, d1, d2 = (torch.load(models / f'{step}_{name}.pth', weights_only=True)['params']
                      for name in ('G', 'D') for step in (1, 2))
    assert not torch.equal(g1['implicit_warp.q.weight'], g2['implicit_warp.q.weight'])  # G trained at step 2
    assert not torch.equal(g1['swin_backbone.forward_2.conv_after_body.weight'],
                           g2['swin_backbone.forward_2.conv_after_body.weight'])
    assert any(not torch.equal(d1[k], d2[k]) for k in d1)
