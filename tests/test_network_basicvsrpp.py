"""BasicVSR++ network tests.

Fixtures in tests/fixtures/basicvsrpp/ were made in a scratch directory by running the reference: BasicSR's
``basicvsrpp_arch.py`` (with its ``ModulatedDeformConvPack`` parameters and torchvision's ``deform_conv2d``, which
its forward already calls, and without its "alignment only with CUDA" guard):

* ``state_dict_shapes.json.gz``: ``{key: shape}``, persistent buffers and parameter counts of the defaults and the
  released constructors (c64n7 x4, c64n15 and c128n25 same-size, c128n25 x4);
* ``golden_<case>.pt``: output (every ``step``-th pixel), statistics and some parameter gradients of tiny
  configurations filled with ``deterministic_fill`` on a seeded input: x4 from 64x64 frames ('sr'), the same-size
  form on 160x176 frames ('deblur') and a mirror-extended x4 clip at 40x48 ('mirror_small'); for the last two the
  reference's assert that SpyNet's frames have 64+ pixels was removed (a check, not part of the computation);
* ``mmagic_state_dict_shapes.json.gz``: the released files' key names and shapes (``generator.`` prefixed), recorded
  from mmagic's ``BasicVSRPlusPlusNet`` module structure (mmcv's ``ConvModule`` and ``ModulatedDeformConv2d``
  stood in by modules with their parameter names) for the four released constructors.
"""

from __future__ import annotations

import csv
import gzip
import hashlib
import json
import os
from pathlib import Path

import pytest
import torch
from torch import Tensor

import models.network_basicvsrpp as bvpp
from data.dataset_synthetic import SyntheticVideoTestDataset
from engine import evaluate
from models import layers_conv, layers_deform_conv
from models.basicvsrpp_keymap import from_mmagic, to_mmagic
from models.layers_warp import force_deterministic_kernels
from models.model_zoo import TASKS, ModelZooError, TaskSpec
from models.net_io import net_io
from models.network_basicvsrpp import BasicVSRPlusPlus, SecondOrderDeformableAlignment
from tests.support.golden import assert_grads_close, assert_same_layout, deterministic_fill, shape_table
from utils import utils_checkpoint, utils_download
from utils.utils_image import imwrite_rgb

FIXTURES = Path(__file__).parent / 'fixtures' / 'basicvsrpp'
REDS4 = 'basicvsr_plusplus_c64n7_8x1_600k_reds4_20210217-db622b2f'

# Output atol per case: about 3x the largest error measured against the reference at one thread (6.0e-8, 1.2e-7,
# 6.0e-8); in fp64 ours and the reference agree to 3e-15, so the gaps are fp32 rounding.
GOLDEN_OUT_ATOL = {'sr': 2e-7, 'deblur': 4e-7, 'mirror_small': 2e-7}
# Gradient tolerance relative to each tensor's largest entry, per parameter group. The fixture's gradients are the
# reference's fp32 rounding on the machine that recorded them (Intel, AVX-512), ours are this machine's: both differ
# from the exact gradient (our fp64 run, which equals the reference's fp64 to 3e-15) by a rounding error that
# depends on the kernels (benchmarks/RESULTS.md, BasicVSR++ "golden gradient tolerances"). Measured, relative to
# the largest entry, fixture vs fp64 and ours fp32 vs fp64 (AMD EPYC AVX2; 1 vs 2 threads changes ours by <2e-6):
# * SpyNet and the deformable offset branch (conv_offset): tiny gradients (largest entries 3e-9 to 3e-7) that are
#   sums of large cancelling terms through bilinear sampling: up to 9.2e-4 (fixture, deblur spynet level 5) and
#   7.1e-4 (ours, sr offset conv 0), in either direction, so two fp32 runs can differ by their sum, 1.6e-3;
# * every other parameter: up to 4.7e-5 (fixture) and 4.9e-5 (ours), sum 1e-4.
# Each tolerance is about 1.5-2x that sum. Deliberate bugs still fail (sr, deblur): max_residue_magnitude 9.9 for
# 10 or flipped flow directions move the SpyNet/offset gradients 18-260x past their tolerance (the sr output 2.7-10x
# past its atol); flows detached from the offsets (output unchanged) 400x; SpyNet's gradient scaled by 1.01 3.9x
# (by 1.003 just past it). Numbers in RESULTS.md.
GRAD_REL = {'cancelling': 2.5e-3, 'other': 2e-4}


def _grad_group(name: str) -> str:
    return 'cancelling' if name.startswith('spynet.') or '.conv_offset.' in name else 'other'


STATS_ATOL = 2e-7

pytestmark = pytest.mark.usefixtures('one_thread')


@pytest.mark.parametrize('name', sorted(shape_table(FIXTURES)))
def test_state_dict_keys_and_shapes_match_reference(name: str) -> None:
    assert_same_layout(BasicVSRPlusPlus, shape_table(FIXTURES)[name])


@pytest.mark.parametrize('case', sorted(GOLDEN_OUT_ATOL))
def test_golden_matches_reference(case: str) -> None:
    """Same weights and input as the reference run -> same output and parameter gradients, to fp32 rounding."""
    out_atol = GOLDEN_OUT_ATOL[case]
    data = torch.load(FIXTURES / f'golden_{case}.pt', weights_only=True)
    torch.manual_seed(0)
    net = BasicVSRPlusPlus(**data['config'])
    deterministic_fill(net, data['fill_seed'])
    x = torch.rand(data['input_shape'], generator=torch.Generator().manual_seed(data['input_seed']))
    if data['mirror']:
        x = torch.cat([x, x.flip(1)], dim=1)
        assert net.is_mirror_extended(x)
    out = net(x)
    s = data['step']
    torch.testing.assert_close(out.detach()[..., ::s, ::s], data['output_sub'], atol=out_atol, rtol=0)
    assert abs(out.mean().item() - data['output_mean']) <= STATS_ATOL
    assert abs(out.abs().mean().item() - data['output_abs_mean']) <= STATS_ATOL
    loss = out.square().mean()
    assert abs(loss.item() - data['loss']) <= STATS_ATOL
    loss.backward()
    assert len(data['grads']) >= 7
    for group, rel in GRAD_REL.items():
        grads = {k: v for k, v in data['grads'].items() if _grad_group(k) == group}
        assert grads, f'{case}: no recorded gradient in group {group}'
        assert_grads_close(net, grads, case, rel=rel)


def _released_file(path: Path, layout: str, seed: int = 0) -> dict[str, torch.Tensor]:
    """A file laid out as the released mmediting/mmagic checkpoints (``{'meta', 'state_dict'}``, ``generator.``
    keys, the model's ``step_counter``), with small random values; returns its state dict."""
    gen = torch.Generator().manual_seed(seed)
    shapes = json.load(gzip.open(FIXTURES / 'mmagic_state_dict_shapes.json.gz', 'rt'))[layout]['shapes']
    sd = {k: 0.02 * torch.randn(v, generator=gen) for k, v in shapes.items()}
    sd['generator.spynet.mean'] = torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1)
    sd['generator.spynet.std'] = torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1)
    torch.save({'meta': {'mmedit_version': '0.7.0', 'iter': 600000}, 'state_dict': {**sd, 'step_counter':
               torch.zeros(1)}}, path)
    return sd


@pytest.mark.parametrize('layout', ['reds4_vimeo_c64n7', 'deblur_c64n15', 'ntire_vsr_c128n25',
                                    'ntire_decompress_c128n25'])
def test_released_key_names_map_onto_ours(layout: str) -> None:
    """Every released key maps to one of ours with its shape, and back (on the meta device: no weights)."""
    entry = json.load(gzip.open(FIXTURES / 'mmagic_state_dict_shapes.json.gz', 'rt'))[layout]
    with torch.device('meta'):
        ours = BasicVSRPlusPlus(**entry['kwargs']).state_dict()
    released = {k: torch.empty(v, device='meta') for k, v in entry['shapes'].items()}
    mapped = from_mmagic({**released, 'step_counter': torch.empty(1, device='meta')})
    assert {k: tuple(v.shape) for k, v in mapped.items()} == {k: tuple(v.shape) for k, v in ours.items()}
    assert set(to_mmagic(ours)) == set(released)
    assert from_mmagic(ours).keys() == ours.keys()  # BasicSR-format dicts pass unchanged


def _clips(root: Path) -> tuple[str, str]:
    data = SyntheticVideoTestDataset({'task': 'sr', 'num_clips': 1, 'num_frame': 3, 'lq_size': [36, 40], 'seed': 3,
                                      'scale': 4})
    for item in data:
        for side, frames in (('lq', item['L']), ('gt', item['H'])):
            for t, frame in enumerate(frames):
                imwrite_rgb(str(root / side / item['folder'] / f'{t:08d}.png'), frame)
    return str(root / 'lq'), str(root / 'gt')


def test_released_checkpoint_runs_through_main_test_vrt_task(tmp_path, monkeypatch) -> None:
    """``--task`` builds the released constructor, loads an mmagic-layout file strictly through the key map, and
    evaluates; the file under the release's name is refused when its SHA-256 is not the release's."""
    monkeypatch.chdir(tmp_path)
    spec = TASKS[REDS4]
    assert spec.url == ('https://download.openmmlab.com/mmediting/restorers/basicvsr_plusplus/'
                        'basicvsr_plusplus_c64n7_8x1_600k_reds4_20210217-db622b2f.pth')
    released = _released_file(tmp_path / 'mine.pth', 'reds4_vimeo_c64n7')
    setup = evaluate.setup_model(evaluate.build_parser().parse_args(['--task', REDS4, '--model_path', 'mine.pth']))
    assert setup.io.scale == 4 and setup.tile == (100, 256)  # on the CPU: its 100-frame tile, not the whole clip
    ours = setup.net.state_dict()
    assert torch.equal(ours['upconv1.weight'], released['generator.upsample1.upsample_conv.weight'])
    assert torch.equal(ours['spynet.basic_module.3.basic_module.6.bias'],
                       released['generator.spynet.basic_module.3.basic_module.3.conv.bias'])
    assert torch.equal(ours['deform_align.forward_2.conv_offset.6.weight'],
                       released['generator.deform_align.forward_2.conv_offset.6.weight'])

    lq, gt = _clips(tmp_path / 'clips')
    save = tmp_path / 'results'
    code = evaluate.main(['--task', REDS4, '--model_path', 'mine.pth', '--folder_lq', lq, '--folder_gt', gt,
                          '--device', 'cpu', '--num_workers', '0', '--save_dir', str(save)])
    assert code == 0
    with open(save / 'metrics.csv') as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 3 and all(float(r['psnr']) > 15 for r in rows)  # small weights: about the bilinear skip

    os.makedirs('model_zoo/basicvsrpp')
    os.replace('mine.pth', spec.default_model_path)
    with pytest.raises(ModelZooError, match=f'has SHA-256 .* but the release .* has {spec.sha256}') as info:
        spec.check_model_file(spec.default_model_path)
    assert '\n' not in str(info.value)


def test_model_zoo_checks_what_the_names_carry(tmp_path) -> None:
    """The full SHA-256 where known (REDS4), else the 8-hex-digit prefix the official name carries; the deblurring
    weights, published only in the authors' folder, are an error naming the folder and the file to save."""
    assert TASKS[REDS4].sha256.startswith(TASKS[REDS4].sha256_prefix) and len(TASKS[REDS4].sha256) == 64
    for spec in (s for s in TASKS.values() if s.net_type == 'basicvsrpp'):
        assert spec.name.endswith('-' + spec.sha256_prefix) and len(spec.sha256_prefix) == 8
    for spec in (s for s in TASKS.values() if s.net_type != 'basicvsrpp'):
        assert not spec.sha256 and not spec.sha256_prefix  # the VRT/RVRT releases publish no digest

    data = tmp_path / 'w.pth'
    data.write_bytes(b'weights')
    digest = utils_download.sha256_of(data)
    other = hashlib.sha256(b'other').hexdigest()
    name = f'release-{digest[:8]}'
    (tmp_path / f'{name}.pth').write_bytes(b'weights')
    path = str(tmp_path / f'{name}.pth')
    TaskSpec(name, 'basicvsrpp', {}, (0, 0, 0), sha256_prefix=digest[:8]).check_model_file(path)
    TaskSpec(name, 'basicvsrpp', {}, (0, 0, 0), sha256=digest, sha256_prefix=digest[:8]).check_model_file(path)
    TaskSpec(name, 'basicvsrpp', {}, (0, 0, 0), sha256_prefix=other[:8]).check_model_file(str(data))  # own name
    with pytest.raises(ModelZooError, match=f'has one starting with {other[:8]} .the prefix its name carries'):
        TaskSpec(name, 'basicvsrpp', {}, (0, 0, 0), sha256_prefix=other[:8]).check_model_file(path)
    full = digest[:8] + other[8:]  # the right prefix but another file: the full digest decides
    with pytest.raises(ModelZooError, match=f'has SHA-256 {digest}, but the release {name}.pth has {full}'):
        TaskSpec(name, 'basicvsrpp', {}, (0, 0, 0), sha256=full, sha256_prefix=digest[:8]).check_model_file(path)
    for bad in ({'sha256': digest[:8]}, {'sha256_prefix': 'DB622B2F'}, {'sha256': other, 'sha256_prefix': '00'}):
        with pytest.raises(ValueError, match='TaskSpec'):
            TaskSpec(name, 'basicvsrpp', {}, (0, 0, 0), **bad)

    dvd = TASKS['basicvsr_plusplus_deblur_dvd-ecd08b7f']
    assert dvd.url == '' and dvd.published_in.startswith('https://www.dropbox.com/sh/gopo637rbutlxde/')
    with pytest.raises(ModelZooError, match='Download basicvsr_plusplus_deblur_dvd-ecd08b7f.pth from '
                                            'https://www.dropbox.com/sh/gopo637rbutlxde/') as info:
        dvd.check_model_file(str(tmp_path / 'missing' / 'basicvsr_plusplus_deblur_dvd-ecd08b7f.pth'))
    assert '\n' not in str(info.value) and 'missing/basicvsr_plusplus_deblur_dvd-ecd08b7f.pth' in str(info.value)


def _tiny(**kwargs) -> BasicVSRPlusPlus:
    torch.manual_seed(0)
    net = BasicVSRPlusPlus(**{'mid_channels': 8, 'num_blocks': 1, **kwargs})
    deterministic_fill(net, 1, gain=0.3)
    return net


def test_io_and_input_sizes() -> None:
    sr, same = _tiny(), _tiny(is_low_res_input=False)
    assert net_io(sr).scale == 4 and net_io(sr).input_multiple == (1, 1, 1) and net_io(sr).temporal_tile == 100
    assert net_io(same).scale == 1 and net_io(same).input_multiple == (1, 4, 4)
    with torch.no_grad():
        assert sr(torch.rand(1, 1, 3, 33, 35)).shape == (1, 1, 3, 132, 140)  # one frame: no alignment
        assert same(torch.rand(2, 2, 3, 132, 136)).shape == (2, 2, 3, 132, 136)
    for net, shape, words in ((sr, (1, 2, 3, 32, 40), 'larger than 32x32 .* pad to at least 33x40'),
                              (sr, (1, 2, 4, 40, 40), '3 input channels'),
                              (sr, (2, 40, 40), r'\(N, T, C, H, W\)'),
                              (same, (1, 2, 3, 130, 136), 'multiples of 4 and at least 132 .* pad to 132x136'),
                              (same, (1, 2, 3, 134, 136), 'pad to 136x136')):
        with pytest.raises(ValueError, match=words) as info:
            net(torch.rand(shape))
        assert '\n' not in str(info.value)
    with pytest.raises(ValueError, match='multiple of 8'):
        BasicVSRPlusPlus(mid_channels=12)


def test_inference_path_matches_the_recorded_one_and_follows_weight_changes(monkeypatch) -> None:
    """Without autograd the CPU forward copies straight into channels-last buffers, works in place and keeps
    channels-last copies of the convolution weights: the same bits as the forward autograd records in channels-last
    (two clips, so a mixed-up frame order shows), and weights changed in place (an optimizer step, load_state_dict)
    are seen."""
    # the recorded forward in channels-last too (on AVX2 CPUs training runs NCHW, which rounds otherwise)
    monkeypatch.setattr(layers_conv, 'nchw_trains_faster', lambda: False)
    net = _tiny().eval()
    x = torch.rand(2, 3, 3, 36, 36, generator=torch.Generator().manual_seed(5))
    for step in range(2):
        with torch.no_grad():
            if step:
                net.upconv1.weight.mul_(1.5)
                net.deform_align['forward_1'].conv_offset[0].weight.add_(0.01)
            fast = net(x)
        torch.testing.assert_close(fast, net(x).detach(), atol=0, rtol=0)


def test_mirror_flag_is_per_forward_and_chunking_changes_nothing(monkeypatch) -> None:
    """A mirrored input does not change how a later input is processed (BasicSR bug); computing flows, features
    and reconstruction in frame chunks gives the same output."""
    net = _tiny().eval()
    g = torch.Generator().manual_seed(3)
    half = torch.rand(1, 2, 3, 36, 36, generator=g)
    mirrored = torch.cat([half, half.flip(1)], dim=1)
    plain = torch.rand(1, 3, 3, 36, 36, generator=g)
    with torch.no_grad():
        expected = net(plain)
        net(mirrored)
        torch.testing.assert_close(net(plain), expected, atol=0, rtol=0)
        forward, backward = net.compute_flow(mirrored, mirrored=False)
        torch.testing.assert_close(forward, backward.flip(1), atol=1e-5, rtol=1e-5)
        chunked = net.compute_flow(plain, chunk=1)
        for a, b in zip(chunked, net.compute_flow(plain)):
            torch.testing.assert_close(a, b, atol=1e-6, rtol=0)
        monkeypatch.setattr(bvpp, 'HEAD_PIXELS', 36 * 36)  # one frame per chunk
        torch.testing.assert_close(net(plain), expected, atol=1e-6, rtol=0)


def test_deformable_alignment_kernels_agree() -> None:
    """torchvision's deform_conv2d (GPU path) and the sampled formulation (CPU, deterministic mode) agree, forward
    and backward, with offsets of several pixels."""
    torch.manual_seed(0)
    align = SecondOrderDeformableAlignment(8, max_residue_magnitude=10)
    deterministic_fill(align, 2, gain=2.0)
    g = torch.Generator().manual_seed(1)
    x, extra = torch.rand(2, 16, 12, 13, generator=g), torch.rand(2, 24, 12, 13, generator=g)
    f1, f2 = 3 * torch.randn(2, 2, 12, 13, generator=g), 3 * torch.randn(2, 2, 12, 13, generator=g)
    results = []
    for impl in ('torchvision', 'sampled'):
        align.impl = impl
        align.zero_grad()
        xi = x.clone().requires_grad_()
        out = align(xi, extra, f1, f2)
        out.square().sum().backward()
        results.append((out.detach(), xi.grad, align.weight.grad.clone(), align.conv_offset[0].weight.grad.clone()))
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize(('n', 'h'), [(1, 9), (2, 9), (1, 10)])
def test_sampled_deform_conv_channels_last_input(n: int, h: int) -> None:
    """The sampled formulation groups a channels-last input's channels as an NCHW one's, to the bit (it samples
    from an NCHW copy), with and without gradients; a square frame's grid (one scalar divisor without autograd)
    too."""
    g = torch.Generator().manual_seed(0)
    x = torch.rand(n, 16, h, 10, generator=g)
    offset, mask = 3 * torch.randn(n, 2 * 4 * 9, h, 10, generator=g), torch.rand(n, 4 * 9, h, 10, generator=g)
    weight, bias = torch.randn(8, 16, 3, 3, generator=g), torch.randn(8, generator=g)
    expected = layers_deform_conv.deform_conv3x3_sampled(x, offset, mask, weight, bias)
    for grad in (False, True):
        with torch.set_grad_enabled(grad):
            out = layers_deform_conv.deform_conv3x3_sampled(x.contiguous(memory_format=torch.channels_last), offset,
                                                             mask, weight, bias)
        assert torch.equal(out, expected)


def test_autocast_keeps_flows_and_offsets_fp32(monkeypatch) -> None:
    seen = {}

    def spy(x, offset, mask, weight, bias):
        seen['dcn'] = (x.dtype, offset.dtype, mask.dtype, weight.dtype)
        return real(x, offset, mask, weight, bias)

    real = layers_deform_conv.deform_conv3x3_sampled
    monkeypatch.setattr(layers_deform_conv, 'deform_conv3x3_sampled', spy)
    net = _tiny()
    x = torch.rand(1, 3, 3, 36, 36, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        full = net(x)
        with torch.autocast('cpu', dtype=torch.bfloat16):
            flows = net.compute_flow(x)
            half = net(x)
    assert all(f.dtype == torch.float32 for f in flows)
    assert seen['dcn'] == (torch.float32,) * 4
    assert torch.isfinite(half).all() and (half.float() - full).abs().mean() < 5e-3  # 9.0e-4 measured


def test_deterministic_mode_trains_through_the_formulations() -> None:
    """Forced deterministic kernels (as off the CPU in deterministic mode): same output, finite gradients."""
    net = _tiny(is_low_res_input=False)
    x = torch.rand(1, 3, 3, 132, 132, generator=torch.Generator().manual_seed(0))
    out = net(x)
    with force_deterministic_kernels(True):  # the backward too: the mode holds for the whole step
        det = net(x)
        det.mean().backward()
    torch.testing.assert_close(det, out, atol=1e-5, rtol=0)
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in net.parameters())
    assert net.deform_align['backward_2'].weight.grad.abs().sum() > 0


def test_missing_spynet_file_is_an_error(tmp_path) -> None:
    with pytest.raises(FileNotFoundError, match='spynet'):
        BasicVSRPlusPlus(mid_channels=8, spynet_path=str(tmp_path / 'spynet.pth'))


def test_basicsr_format_checkpoint_loads_strictly(tmp_path) -> None:
    net = _tiny()
    torch.save({'params': net.state_dict()}, tmp_path / 'g.pth')
    other = BasicVSRPlusPlus(mid_channels=8, num_blocks=1)
    utils_checkpoint.load_network(other, str(tmp_path / 'g.pth'), strict=True)
    assert all(torch.equal(a, b) for a, b in zip(net.state_dict().values(), other.state_dict().values()))


def test_recipes_carry_the_published_settings() -> None:
    from engine.options import parse_options
    from models.select_network import define_G

    recipes = sorted((Path(__file__).parents[1] / 'options' / 'basicvsrpp').glob('*.json'))
    assert [p.name[:3] for p in recipes] == ['001', '002', '003', '004', '005']
    for path in recipes:
        opt = parse_options(str(path), ['netG.spynet_path=null'])
        train, data = opt['train'], opt['datasets']['train']
        assert (train['G_optimizer_lr'], train['fix_lr_mul'], train['fix_keys']) == (1e-4, 0.25, ['spynet'])
        assert train['fix_iter'] == (-1 if 'vimeo' in path.name else 5000)
        assert train['G_scheduler_periods'] == train['total_iter'] and data['dataloader_batch_size'] == 8
        assert data['num_frame'] == (7 if 'vimeo' in path.name else 30) and data['gt_size'] == 256
        with torch.device('meta'):
            io = net_io(define_G(opt))
        assert io.scale == (1 if 'deblurring' in path.name else 4) == opt['scale']


def test_bf16_accumulated_training_resumes_exactly(tmp_path, monkeypatch) -> None:
    """bf16 autocast, 2 accumulation steps and SpyNet unfrozen at step 2: 2 steps equal 1 step, then a resumed
    run to step 2 (checkpoints and logged losses bit-identical; in process, one thread)."""
    import main_train_vrt
    from tests.support.helpers import assert_same_run, write_opt

    for key in ('RANK', 'LOCAL_RANK', 'WORLD_SIZE'):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.chdir(tmp_path)
    net = {'net_type': 'basicvsrpp', 'mid_channels': 8, 'num_blocks': 1, 'spynet_path': None}
    opt = write_opt(tmp_path, netG=net, datasets={'train': {'gt_size': 132}, 'test': {'lq_size': [36, 36]}},
                    train={'total_iter': 2, 'checkpoint_save': 1, 'amp': 'bf16', 'grad_accum_steps': 2,
                           'fix_iter': 2, 'fix_keys': ['spynet'], 'fix_lr_mul': 0.25})
    assert main_train_vrt.main(['--opt', opt, '--set', 'task=ref']) == 0
    assert main_train_vrt.main(['--opt', opt, '--set', 'task=part', '--set', 'train.total_iter=1']) == 0
    assert main_train_vrt.main(['--opt', opt, '--set', 'task=part']) == 0
    assert_same_run(tmp_path, 'ref', 'part', 2)


def _cached_and_plain(net: BasicVSRPlusPlus, x: Tensor, force: bool) -> list[tuple[Tensor, Tensor, dict]]:
    """(output, input gradient, parameter gradients), on the CPU, of the plain forward, then of the cached one (T
    one past ``cpu_cache_length``; ``force``: also on the CPU)."""
    results = []
    for cached in (False, True):
        net.cpu_cache_length, net._force_cpu_cache = (x.shape[1] - 1, force) if cached else (x.shape[1], False)
        net.zero_grad()
        xi = x.clone().requires_grad_()
        out = net(xi)
        out.square().mean().backward()
        results.append((out.detach().cpu(), xi.grad.cpu(), {k: p.grad.cpu() for k, p in net.named_parameters()}))
    return results


@pytest.mark.parametrize('low_res', [True, False])
def test_cpu_cache_mode_equals_the_plain_forward(low_res: bool, monkeypatch) -> None:
    """Cache mode (forced on the CPU, where its moves to and from the CPU are no-ops) on a clip longer than
    ``cpu_cache_length``: chunked SpyNet, per-step moves, chunked head. Like mmagic and BasicSR it also runs in
    training, so gradients are compared too. The output and the input's gradient are bit-identical (the chunked
    SpyNet batches compute each frame pair alike here); parameter gradients are identical except SpyNet's, whose
    weight gradients are summed over the chunks in another order: within 5e-5 of the largest entry (measured 7e-6;
    SpyNet's gradients are tiny sums of cancelling terms, see ``GRAD_REL``)."""
    net = _tiny(is_low_res_input=low_res)
    # the plain forward's head on the frames together too, as in cache mode (and on a GPU): on the CPU it takes one
    # frame at a time, whose convolutions round otherwise
    monkeypatch.setattr(net, '_head_frame_by_frame', lambda device, cache: False)
    size = 36 if low_res else 132
    monkeypatch.setattr(bvpp, 'HEAD_PIXELS', 2 * (size if low_res else size // 4) ** 2)  # chunks of 2 frames
    chunks = []
    real = net.compute_flow
    monkeypatch.setattr(net, 'compute_flow',
                        lambda *a, chunk=0, **k: chunks.append(chunk) or real(*a, chunk=chunk, **k))
    x = torch.rand(1, 3, 3, size, size, generator=torch.Generator().manual_seed(4))
    (out, x_grad, grads), (c_out, c_x_grad, c_grads) = _cached_and_plain(net, x, force=True)
    assert chunks == [0, 2]  # the plain forward, then the cached one
    torch.testing.assert_close(c_out, out, atol=0, rtol=0)
    torch.testing.assert_close(c_x_grad, x_grad, atol=0, rtol=0)
    for name, grad in grads.items():
        tol = 5e-5 * grad.abs().max().item() if name.startswith('spynet.') else 0
        torch.testing.assert_close(c_grads[name], grad, atol=tol, rtol=0, msg=name)


def test_cpu_training_takes_the_head_one_frame_at_a_time(monkeypatch) -> None:
    """CPU training runs the x4 head frame by frame (the whole step 1.17x, benchmarks/RESULTS.md): the head is really
    called once a frame, and output and gradients equal the head on all frames at once to rounding."""
    net = _tiny().train()
    x = torch.rand(1, 3, 3, 36, 36, generator=torch.Generator().manual_seed(6))
    calls = []
    real = net._head
    monkeypatch.setattr(net, '_head', lambda feats, lqs: calls.append(feats.shape[0]) or real(feats, lqs))
    results = []
    for together in (False, True):
        if together:
            monkeypatch.setattr(net, '_head_frame_by_frame', lambda device, cache: False)
        calls.clear()
        net.zero_grad()
        out = net(x)
        out.square().mean().backward()
        results.append((out.detach(), {k: p.grad.clone() for k, p in net.named_parameters()}, list(calls)))
    (out, grads, calls_frames), (out_all, grads_all, calls_all) = results
    assert calls_frames == [1, 1, 1] and calls_all == [3]
    torch.testing.assert_close(out, out_all, atol=1e-6, rtol=0)
    for name, grad in grads_all.items():
        net.get_parameter(name).grad = grads[name]
    assert_grads_close(net, grads_all, 'frame by frame', rel=1e-4)


def test_cpu_cache_mode_returns_on_the_input_device() -> None:
    """Training on a GPU with a clip past ``cpu_cache_length``: the features wait on the CPU, the output must come back
    to the GPU, where the loss meets the GT. Without a GPU, the forward runs on fake tensors that carry a CUDA device
    (FakeTensorMode: shapes and devices only, and an op that mixes devices fails as on a real GPU)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode(), torch.backends.cudnn.flags(enabled=False):  # cuDNN's grid sampler has no fake kernel
        with torch.device('cuda'):
            net = _tiny()
            net.cpu_cache_length = 2
            x, gt = torch.rand(1, 3, 3, 36, 36), torch.rand(1, 3, 3, 144, 144)
        out = net(x)
        assert net.spynet.mean.device.type == 'cuda'
        assert out.device == x.device and out.shape == gt.shape
        loss = torch.sqrt((out - gt) ** 2 + 1e-9).mean()  # the training loss, on the GPU
        assert loss.device == x.device


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason='needs a CUDA device')
@pytest.mark.parametrize('low_res', [True, False])
def test_cpu_cache_mode_on_a_gpu(low_res: bool) -> None:
    """The real thing: features and flows on the CPU, computation and output on the GPU; torchvision's
    deform_conv2d accumulates with atomics there, hence the tolerances."""
    net = _tiny(is_low_res_input=low_res).cuda()
    size = 36 if low_res else 132
    x = torch.rand(1, 4, 3, size, size, generator=torch.Generator().manual_seed(4)).cuda()
    (out, x_grad, grads), (c_out, c_x_grad, c_grads) = _cached_and_plain(net, x, force=False)
    assert net(x).device == x.device  # the cached mode's output comes back from the CPU
    torch.testing.assert_close(c_out, out, atol=1e-5, rtol=0)
    torch.testing.assert_close(c_x_grad, x_grad, atol=1e-6, rtol=0)
    for name, grad in grads.items():
        torch.testing.assert_close(c_grads[name], grad, atol=1e-3 * grad.abs().max().item(), rtol=0, msg=name)
