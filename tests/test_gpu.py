"""The CUDA branches: device placement, NCCL + DDP, CUDA RNG state, SDPA kernels, goldens, deformable ops, AMP,
deterministic mode, tiled inference and torch.compile. Skipped without CUDA (``pytest -m gpu`` selects them).

fp32 comparisons run with TF32 off (``train.tf32`` false, the default). The tolerances are 2-3x (at the tightest)
the errors measured on an NVIDIA H100 (torch 2.11, CUDA 13.0, cuDNN 9.19; 2026-11-28), noted beside each; the
tests print what they measure (``pytest -m gpu -rP``).

The same non-CPU code paths run on the meta device in CI: tests/test_attention.py (released models, kernel
eligibility of every attention call) and tests/test_deterministic_ops.py (deterministic mode).
"""

from __future__ import annotations

import contextlib
import copy
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torchvision
from torch.nn.attention import SDPBackend, sdpa_kernel

from models import layers_window
from models.layers_deform_attn import deform_attn
from models.layers_deform_conv import deform_conv3x3_sampled
from models.layers_sdpa import attention, record_attention_calls
from models.model_gan import ModelGAN
from models.model_vrt import ModelVRT
from models.model_zoo import TASKS
from models.network_rvrt import RVRT
from models.network_vrt import VRT
from models.video_inference import infer_video
from tests.support.golden import RVRT_GOLDEN, VRT_GOLDEN, assert_grads_close, deterministic_fill, grad_errors
from tests.support.helpers import RVRT_TINY_OPT, VRT_TINY_OPT, assert_ok, assert_same_run, base_env, single, write_opt
from utils import utils_checkpoint as ckpt
from utils import utils_numerics
from utils.utils_dist import DistError, DistInfo, get_dist_info, init_dist
from utils.utils_numerics import AMP_DTYPES
from utils.utils_option import parse

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason='needs a CUDA device')]

FIXTURES = Path(__file__).parent / 'fixtures'
CUDA = torch.device('cuda', 0)
# head dims 20 (40 / 2) and 30 (60 / 2), VRT's (120 / 6, 180 / 6), in a network small enough for every test
VRT_SMALL = {'upscale': 4, 'img_size': (2, 40, 40), 'window_size': (2, 4, 4), 'depths': (2,) * 7 + (1, 1),
             'indep_reconsts': (8,), 'embed_dims': (40,) * 7 + (60, 60), 'num_heads': (2,) * 9, 'pa_frames': 2,
             'deformable_groups': 4, 'drop_path_rate': 0.0}
RVRT_SMALL = {'upscale': 4, 'clip_size': 2, 'window_size': (2, 4, 4), 'num_blocks': (1, 1, 1), 'depths': (2, 2, 2),
              'embed_dims': (24, 24, 24), 'num_heads': (2, 2, 2), 'deformable_groups': 4, 'attention_heads': 4}


@pytest.fixture(autouse=True)
def fp32_numerics() -> Iterator[None]:
    """TF32 off, default kernels; the process-wide settings are restored afterwards."""
    before = utils_numerics.current_state()
    utils_numerics.apply_policy(deterministic=False, tf32=False, device=CUDA)
    yield
    utils_numerics.restore_state(before)


def _rand(*shape: int, seed: int = 0, device: torch.device = CUDA) -> torch.Tensor:
    return torch.rand(*shape, generator=torch.Generator().manual_seed(seed)).to(device)


def _small(cls: type, kwargs: dict, seed: int = 1) -> torch.nn.Module:
    torch.manual_seed(0)
    net = cls(**kwargs)
    deterministic_fill(net, seed)  # non-zero offset branches: the deformable ops see real offsets
    return net


def _max_rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach().float(), b.detach().float()
    value = float((a - b).abs().max() / b.abs().max().clamp_min(1e-12))
    print(f'max relative error {value:.2e}')  # `pytest -m gpu -rP` shows the measured errors the tolerances follow
    return value


def _print_golden_errors(case: str, out: torch.Tensor, expected: torch.Tensor, net: torch.nn.Module,
                         grads: dict[str, torch.Tensor]) -> None:
    """The largest output error and gradient error (relative to each gradient's largest entry) against a fixture."""
    errors = grad_errors(net, grads)
    worst = max(errors, key=errors.get)
    print(f'{case}: output {float((out.detach().cpu() - expected).abs().max()):.2e}, '
          f'gradient {errors[worst]:.2e} ({worst})')


# ----------------------------------------------------------------------------------------- runtime plumbing
def test_device_from_local_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    last = torch.cuda.device_count() - 1
    for key in ('RANK', 'WORLD_SIZE', 'VRT_DEVICE'):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv('LOCAL_RANK', str(last))
    info = init_dist()  # one process: no process group, but the device is selected and made current
    assert info.device == torch.device('cuda', last) and torch.cuda.current_device() == last
    monkeypatch.setenv('VRT_DEVICE', 'cpu')
    assert get_dist_info().device == torch.device('cpu')
    monkeypatch.delenv('VRT_DEVICE')
    monkeypatch.setenv('LOCAL_RANK', str(last + 1))
    with pytest.raises(DistError, match='LOCAL_RANK'):
        get_dist_info()
    torch.cuda.set_device(0)


def _model_opt(tmp_path: Path, net: dict, **train) -> dict:
    base = {'task': 'gpu', 'model': 'vrt', 'scale': net.get('upscale', 4), 'path': {'root': str(tmp_path)},
            'datasets': {}, 'netG': {'net_type': 'vrt', **{k: list(v) if isinstance(v, tuple) else v
                                                            for k, v in net.items()}},
            'train': {'G_lossfn_type': 'charbonnier', 'G_optimizer_lr': 1e-4, 'manual_seed': 0, **train}}
    return parse(None, base=base)


def _batch(net: dict, seed: int = 0) -> dict[str, torch.Tensor]:
    d, h, w = net['img_size']
    s = net['upscale']
    return {'L': _rand(1, d, 3, h, w, seed=seed, device=torch.device('cpu')),
            'H': _rand(1, d, 3, h * s, w * s, seed=seed + 1, device=torch.device('cpu'))}


def test_nccl_world_one_ddp_step(tmp_path: Path) -> None:
    """NCCL process group (one rank) and our DDP wrapping: a train step, gradients reduced, buffers not resent."""
    dist.init_process_group('nccl', init_method=f'file://{tmp_path}/store', rank=0, world_size=1, device_id=CUDA)
    try:
        model = ModelVRT(_model_opt(tmp_path, VRT_SMALL), DistInfo(0, 0, 1, CUDA))
        model.dist = DistInfo(0, 0, 2, CUDA)  # wrap() takes its DDP branch from world_size > 1; the group has one rank
        model.init_train()
        ddp = model.net_g_train
        assert isinstance(ddp, torch.nn.parallel.DistributedDataParallel) and ddp.device_ids == [0]
        assert not getattr(ddp, 'forward_sync_buffers', getattr(ddp, 'broadcast_buffers', True))
        before = copy.deepcopy(model.net_g.state_dict())
        model.update_learning_rate(1)
        model.train_step([_batch(VRT_SMALL)], 1)
        assert torch.isfinite(torch.tensor(model.current_log()['G_loss']))
        after = model.net_g.state_dict()
        assert any(not torch.equal(before[k], after[k]) for k in after)
        assert all(v.device == CUDA for v in after.values())
    finally:
        dist.destroy_process_group()


def test_cuda_rng_state_roundtrip(tmp_path: Path) -> None:
    torch.cuda.manual_seed_all(3)
    torch.rand(1, device=CUDA)  # CUDA initialised: its state is captured
    state = ckpt.capture_rng_state()
    assert 'cuda' in state and len(state['cuda']) == torch.cuda.device_count()
    ckpt.atomic_save({'rng': state}, str(tmp_path / 'state.pth'))
    expected = (torch.rand(8, device=CUDA), torch.rand(8))
    torch.rand(100, device=CUDA)
    ckpt.restore_rng_state(ckpt.safe_load(str(tmp_path / 'state.pth'))['rng'])
    assert torch.equal(torch.rand(8, device=CUDA), expected[0]) and torch.equal(torch.rand(8), expected[1])


# -------------------------------------------------------------------------------------------- attention kernels
FUSED = [SDPBackend.EFFICIENT_ATTENTION, SDPBackend.FLASH_ATTENTION]


@pytest.mark.parametrize('hd', [20, 30])
@pytest.mark.parametrize('dtype', [torch.float32, torch.bfloat16])
def test_padded_attention_takes_efficient_kernel_and_equals_math(hd: int, dtype: torch.dtype) -> None:
    """Head dims 20 and 30 with a trainable bias run on the memory-efficient kernel (nothing else allowed), and
    agree with the math kernel on the unpadded inputs, gradients of q, k, v and the bias included."""
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 48, 128, hd, generator=gen).to(CUDA, dtype).requires_grad_() for _ in range(3))
    bias = (0.5 * torch.randn(1, 48, 128, 128, generator=gen)).to(CUDA, dtype).requires_grad_()
    grad = torch.randn(2, 48, 128, hd, generator=gen).to(CUDA, dtype)
    with record_attention_calls() as calls, sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION]):
        out = attention(q, k, v, bias, hd**-0.5)
        ours = [out] + list(torch.autograd.grad(out, (q, k, v, bias), grad))
    assert [c['kernel'] for c in calls] == ['efficient'] and calls[0]['q'][-1] == -(-hd // 8) * 8
    with sdpa_kernel([SDPBackend.MATH]):
        ref_in = [t.detach().double().requires_grad_() for t in (q, k, v, bias)]
        ref_out = torch.nn.functional.scaled_dot_product_attention(*ref_in[:3], attn_mask=ref_in[3], scale=hd**-0.5)
        ref = [ref_out] + list(torch.autograd.grad(ref_out, ref_in, grad.double()))
    tol = 3e-6 if dtype == torch.float32 else 1.5e-2  # H100: 1.2e-6 / 6.4e-3
    for name, a, b in zip(['output', 'q', 'k', 'v', 'bias'], ours, ref):
        assert _max_rel(a, b) < tol, name


def test_grid_limit_chunks_are_correct_on_cuda() -> None:
    """73,728 folded heads (the 12 x 256 x 256 validation tile's shifted mutual attention): chunked below the
    65,535 grid limit, same result as the math kernel."""
    heads, n, hd = 73728, 64, 20
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, heads, n, hd, generator=gen).to(CUDA, torch.bfloat16) for _ in range(3))
    mask = torch.zeros(1, heads, n, n)
    mask[:, ::3, : n // 2, n // 2:] = -100.0
    mask = mask.to(CUDA, torch.bfloat16)
    with torch.no_grad(), record_attention_calls() as calls, sdpa_kernel(FUSED):
        out = attention(q, k, v, mask, hd**-0.5)
    assert [c['q'][1] for c in calls] == [36864, 36864] and {c['kernel'] for c in calls} == {'efficient'}
    with torch.no_grad(), sdpa_kernel([SDPBackend.MATH]):
        ref = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=mask.float(),
                                                               scale=hd**-0.5)
    assert _max_rel(out, ref) < 6e-3  # H100: 2.4e-3


def _train_step_calls(net: torch.nn.Module, x: torch.Tensor, amp: torch.dtype | None) -> list[dict]:
    """Forward + backward with only the fused SDPA kernels allowed (a math fallback raises)."""
    autocast = torch.autocast('cuda', dtype=amp) if amp else contextlib.nullcontext()
    with record_attention_calls() as calls, sdpa_kernel(FUSED):
        with autocast:
            out = net(x)
        out.float().square().mean().backward()
    return calls


@pytest.mark.parametrize('amp', [None, torch.bfloat16], ids=['fp32', 'bf16'])
@pytest.mark.parametrize('task', ['001_VRT_videosr_bi_REDS_6frames', '005_VRT_videodeblurring_DVD',
                                  '001_RVRT_videosr_bi_REDS_30frames'])
def test_every_attention_call_of_the_released_models_is_fused(task: str, amp: torch.dtype | None) -> None:
    """The released settings (head dims 20, 30, 16 and 24) at a small clip, forward and backward: every attention
    call runs on the memory-efficient kernel (trainable bias) or flash/efficient (no mask)."""
    spec = TASKS[task]
    net = (VRT if spec.net_type == 'vrt' else RVRT)(**spec.net_kwargs()).to(CUDA).train()
    size = 64 if spec.kwargs['upscale'] == 4 else 144
    frames = 6 if spec.net_type == 'vrt' else 4
    calls = _train_step_calls(net, _rand(1, frames, 3, size, size), amp)
    assert calls
    for call in calls:
        assert call['blockers'] == [] and call['kernel'] in ('efficient', 'flash'), call
        if call['mask_grad']:
            assert call['kernel'] == 'efficient', call


# ------------------------------------------------------------------------------------------------- goldens
def _golden_tolerance(out_atol: float, grad_rel: float) -> tuple[float, float]:
    """3x / 5x the CPU tests' tolerances. H100's tightest: VRT deblur's output 1.6e-6 (of 6e-6), small_nomut's
    gradient 4.6e-4 (of 1e-3), vfi's 1.5e-5 (of 5e-5); RVRT's outputs 1.2e-7, gradients at most 2.6e-4 (sr)."""
    return 3 * out_atol, 5 * grad_rel


@pytest.mark.parametrize('case', sorted(VRT_GOLDEN))
def test_vrt_golden_on_cuda(case: str) -> None:
    out_atol, grad_rel = _golden_tolerance(*VRT_GOLDEN[case])
    data = torch.load(FIXTURES / 'vrt' / f'golden_{case}.pt', weights_only=True)
    net = VRT(**data['config']).eval()
    deterministic_fill(net, data['fill_seed'])
    net = net.to(CUDA)
    out = net(data['input'].to(CUDA))
    torch.testing.assert_close(out.detach().cpu(), data['output'], atol=out_atol, rtol=0)
    out.square().mean().backward()
    _print_golden_errors(case, out, data['output'], net, data['grads'])
    assert_grads_close(net, {k: v.to(CUDA) for k, v in data['grads'].items()}, case, rel=grad_rel)


@pytest.mark.parametrize('case', sorted(RVRT_GOLDEN))
def test_rvrt_golden_on_cuda(case: str) -> None:
    out_atol, grad_rel = _golden_tolerance(*RVRT_GOLDEN[case])
    data = torch.load(FIXTURES / 'rvrt' / f'golden_{case}.pt', weights_only=True)
    torch.manual_seed(0)
    net = RVRT(**data['config'])
    deterministic_fill(net, data['fill_seed'])
    net = net.to(CUDA)
    x = torch.rand(data['input_shape'], generator=torch.Generator().manual_seed(data['input_seed'])).to(CUDA)
    out = net(x)
    torch.testing.assert_close(out.detach()[..., ::2, ::2].cpu(), data['output_sub'], atol=out_atol, rtol=0)
    out.square().mean().backward()
    _print_golden_errors(case, out[..., ::2, ::2], data['output_sub'], net, data['grads'])
    assert_grads_close(net, {k: v.to(CUDA) for k, v in data['grads'].items()}, case, rel=grad_rel)


# ----------------------------------------------------------------------------------------- deformable ops
@pytest.mark.parametrize('k', [1, 2, 3])
def test_sampled_deform_conv_equals_torchvision_on_cuda(k: int) -> None:
    gen = torch.Generator().manual_seed(k)
    c, g, h, w = 24, 4, 24, 28  # k neighbours: k weight groups (torchvision's implicit groups), as pa_frames 2k
    inputs = [torch.randn(2, k * c, h, w, generator=gen), 3 * torch.randn(2, 18 * g, h, w, generator=gen),
              torch.rand(2, 9 * g, h, w, generator=gen), torch.randn(c, c, 3, 3, generator=gen) / 10,
              torch.randn(c, generator=gen)]
    grad = torch.randn(2, c, h, w, generator=gen).to(CUDA)

    def run(fn) -> list[torch.Tensor]:
        leaves = [t.to(CUDA).requires_grad_() for t in inputs]
        out = fn(*leaves)
        return [out] + list(torch.autograd.grad(out, leaves, grad))

    ours = run(deform_conv3x3_sampled)
    ref = run(lambda x, o, m, wt, b: torchvision.ops.deform_conv2d(x, o, wt, b, padding=(1, 1), mask=m))
    for name, a, b in zip(['output', 'x', 'offset', 'mask', 'weight', 'bias'], ours, ref):
        assert _max_rel(a, b) < 1e-5, name  # H100: 3.8e-6


def test_guided_deform_attn_cuda_equals_cpu() -> None:
    gen = torch.Generator().manual_seed(0)
    n, clip, c, h, w, groups, heads = 2, 2, 24, 20, 22, 4, 4
    inputs = [torch.randn(n * clip, 1, c, h, w, generator=gen), torch.randn(n, clip, 2 * c, h, w, generator=gen),
              2 * torch.randn(n * clip, clip * groups * 18, h, w, generator=gen)]
    grad = torch.randn(n * clip, 1, c, h, w, generator=gen)

    def run(device: torch.device) -> list[torch.Tensor]:
        leaves = [t.to(device).requires_grad_() for t in inputs]
        out = deform_attn(*leaves, 3, 3, 1, 1, 1, heads, groups, clip)
        return [t.cpu() for t in [out, *torch.autograd.grad(out, leaves, grad.to(device))]]

    for name, a, b in zip(['output', 'q', 'kv', 'offset'], run(CUDA), run(torch.device('cpu'))):
        assert _max_rel(a, b) < 1e-6, name  # H100: 3.5e-7


# --------------------------------------------------------------------------------------------------- AMP
def test_bf16_and_fp16_train_steps_close_to_fp32(tmp_path: Path) -> None:
    """The same first step (weights, data) under fp32, bf16 autocast and fp16 autocast + GradScaler: finite losses
    within 5% of fp32's; three more steps stay finite."""
    losses = {}
    for amp in ('none', 'bf16', 'fp16'):
        torch.manual_seed(0)
        model = ModelVRT(_model_opt(tmp_path / amp, VRT_SMALL, amp=amp), DistInfo(0, 0, 1, CUDA))
        model.init_train()
        assert (model.scaler is not None) == (amp == 'fp16')
        history = []
        for step in range(1, 5):
            model.update_learning_rate(step)
            model.train_step([_batch(VRT_SMALL, seed=step)], step)
            history.append(model.current_log()['G_loss'])
        assert all(torch.isfinite(torch.tensor(history))), (amp, history)
        losses[amp] = history[0]
    for amp in ('bf16', 'fp16'):
        assert abs(losses[amp] - losses['none']) <= 0.05 * losses['none'], losses


# --------------------------------------------------------------------------------------------------- GAN
def _gan_opt(tmp_path: Path, **train) -> dict:
    """ModelGAN on the small VRT against a U-Net discriminator, perceptual loss on generated VGG19 conv1 weights."""
    from torchvision.models.vgg import cfgs, make_layers

    torch.manual_seed(3)
    vgg = tmp_path / 'vgg19.pth'
    torch.save({f'features.{k}': v for k, v in make_layers(cfgs['E'])[:3].state_dict().items()}, vgg)
    base = {'task': 'gan', 'model': 'gan', 'scale': 4, 'path': {'root': str(tmp_path)}, 'datasets': {},
            'netG': {'net_type': 'vrt', **{k: list(v) if isinstance(v, tuple) else v for k, v in VRT_SMALL.items()}},
            'netD': {'net_type': 'discriminator_unet', 'base_nc': 8},
            'train': {'G_lossfn_type': 'l1', 'G_optimizer_lr': 1e-4, 'manual_seed': 0, 'F_feature_layer': [2],
                      'F_weights': [1.0], 'F_vgg19_path': str(vgg), 'D_init_iters': 1, 'E_decay': 0.9,
                      'D_optimizer_reuse': True, 'G_optimizer_reuse': True, **train}}
    return parse(None, base=base)


@pytest.mark.parametrize('amp', ['bf16', 'fp16'])
def test_gan_on_cuda_two_ddp_units_spectral_norm_under_autocast_one_fp16_scaler(tmp_path: Path, amp: str) -> None:
    """ModelGAN on the GPU in an NCCL group (one rank): G and D each train through their own DDP wrapper (no buffer
    re-sends), D alone at step 1 then both; under bf16 autocast the spectral-norm vectors stay fp32 and finite and
    D's logits stay within 5% of its fp32 logits; under fp16 one GradScaler steps both optimizers; a checkpoint
    reloads G, E, D and both optimizers exactly."""
    dist.init_process_group('nccl', init_method=f'file://{tmp_path}/store', rank=0, world_size=1, device_id=CUDA)
    try:
        torch.manual_seed(0)
        opt = _gan_opt(tmp_path, amp=amp)
        model = ModelGAN(opt, DistInfo(0, 0, 1, CUDA))
        model.dist = DistInfo(0, 0, 2, CUDA)  # wrap() takes its DDP branch from world_size > 1; the group has one rank
        model.init_train()
        model.load_pretrained()
        g, d = model.units['G'], model.units['D']
        for unit in (g, d):
            ddp = unit.train_net
            assert isinstance(ddp, torch.nn.parallel.DistributedDataParallel) and ddp.device_ids == [0], unit.label
            assert not getattr(ddp, 'forward_sync_buffers', getattr(ddp, 'broadcast_buffers', True)), unit.label
        assert (model.scaler is not None) == (amp == 'fp16')
        stepped, updates = [], []
        if model.scaler is not None:  # one scaler: it steps both optimizers and is updated once a step
            scaler_step, scaler_update = model.scaler.step, model.scaler.update
            model.scaler.step = lambda optimizer: stepped.append(optimizer) or scaler_step(optimizer)
            model.scaler.update = lambda: updates.append(1) or scaler_update()
        g0, d0 = copy.deepcopy(g.net.state_dict()), copy.deepcopy(d.net.state_dict())
        for step in (1, 2, 3):
            model.update_learning_rate(step)
            model.train_step([_batch(VRT_SMALL, seed=step)], step)
            log = model.current_log()
            assert ('D_loss' in log) == (step > 1) and all(torch.isfinite(torch.tensor(v)) for v in log.values()), log
        changed = lambda a, b: any(not torch.equal(a[k], b[k]) for k in a)  # noqa: E731
        assert changed(g0, g.net.state_dict()) and changed(d0, d.net.state_dict())
        vectors = {k: v for k, v in d.net.state_dict().items() if k.endswith(('._u', '._v'))}
        assert vectors and all(v.dtype == torch.float32 and torch.isfinite(v).all() for v in vectors.values())
        assert changed({k: d0[k] for k in vectors}, vectors)  # the power iteration ran
        frames = _batch(VRT_SMALL, seed=9)['H'].to(CUDA)
        with torch.no_grad():
            ref = d.net(frames).float()
            with torch.autocast('cuda', dtype=AMP_DTYPES[amp]):
                low = d.net(frames).float()
        assert _max_rel(low, ref) < {'bf16': 3e-2, 'fp16': 3e-3}[amp]  # H100: 1.1e-2 / 1.1e-3
        if amp == 'fp16':
            assert [id(o) for o in stepped] == [id(d.optimizer), id(g.optimizer), id(d.optimizer),
                                                id(g.optimizer), id(d.optimizer)] and len(updates) == 3
            assert 0 < model.scaler.get_scale() < float('inf')
        model.save(3, {'epoch': 0})
        torch.manual_seed(5)
        resumed = ModelGAN(opt, DistInfo(0, 0, 1, CUDA))
        resumed.init_train()
        resumed.resume(3)
        for label, unit in model.units.items():
            other = resumed.units[label]
            for a, b in ((unit.net, other.net), (unit.ema, other.ema)):
                if a is not None:
                    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
            sa, sb = unit.optimizer.state_dict()['state'], other.optimizer.state_dict()['state']
            assert sa.keys() == sb.keys() and all(torch.equal(sa[i][k], sb[i][k]) for i in sa for k in sa[i]
                                                  if isinstance(sa[i][k], torch.Tensor)), label
        if amp == 'fp16':
            assert resumed.scaler_state() == model.scaler_state()
    finally:
        dist.destroy_process_group()


# ------------------------------------------------------------------------------------------- deterministic mode
@pytest.mark.parametrize('base', [VRT_TINY_OPT, RVRT_TINY_OPT], ids=['vrt', 'rvrt_bf16'])
def test_deterministic_mode_two_runs_bit_identical_on_cuda(tmp_path: Path, base: dict) -> None:
    """The real entry point on the GPU, twice (train.deterministic, the default): weights, optimizer state and
    logged losses after two steps are bit-identical; no op raised under torch.use_deterministic_algorithms."""
    opt = write_opt(tmp_path, base=base, train={'total_iter': 2, 'checkpoint_save': 2, 'grad_accum_steps': 1})
    env = base_env(threads=None, VRT_DEVICE='cuda')
    for task in ('a', 'b'):
        root = os.path.join(tmp_path, 'experiments')
        assert_ok(single(['--opt', opt, '--set', f'task={task}', f'path.root={root}'], env, str(tmp_path),
                         timeout=600))
    log = (tmp_path / 'experiments' / 'a' / 'train.log').read_text()
    assert 'deterministic on' in log and 'Not reproducible' not in log
    assert_same_run(tmp_path, 'a', 'b', 2)


# ------------------------------------------------------------------------------------------- tiled inference
def test_tiled_inference_cuda_equals_cpu() -> None:
    net = _small(VRT, VRT_SMALL).eval()
    lq = _rand(1, 6, 3, 48, 52, seed=5, device=torch.device('cpu'))
    tiling = {'scale': 4, 'window_size': net.window_size, 'num_frame_testing': 4, 'num_frame_overlapping': 2,
              'size_patch_testing': 40, 'overlap_size': 20}
    on_cpu = infer_video(net, lq, device=torch.device('cpu'), **tiling)
    on_cuda = infer_video(net.to(CUDA), lq, device=CUDA, **tiling)
    assert on_cuda.device.type == 'cpu' and on_cuda.shape == on_cpu.shape == (1, 6, 3, 192, 208)
    assert float((on_cuda - on_cpu).abs().max()) < 1e-4


# -------------------------------------------------------------------------------------------------- compile
def test_torch_compile_smoke() -> None:
    """torch.compile of a small VRT: forward and backward run and agree with eager."""
    net = _small(VRT, VRT_SMALL).to(CUDA).train()
    x = _rand(1, 2, 3, 40, 40)
    eager = net(x)
    eager.square().mean().backward()
    grads = {n: p.grad.clone() for n, p in net.named_parameters()}
    net.zero_grad(set_to_none=True)
    compiled = torch.compile(net)
    out = compiled(x)
    out.square().mean().backward()
    assert _max_rel(out, eager) < 1e-4
    largest = max(float(g.abs().max()) for g in grads.values())
    for name, p in net.named_parameters():  # each gradient within 1e-3 of its own scale (or 1% of the largest)
        scale = max(float(grads[name].abs().max()), 1e-2 * largest)
        assert float((p.grad - grads[name]).abs().max()) <= 1e-3 * scale, name


def test_mask_cache_bounded_on_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    """Validation-size tiles leave at most MASK_CACHE_BYTES of shift masks on the GPU."""
    layers_window.MASK_CACHE.clear()
    net = VRT(**TASKS['005_VRT_videodeblurring_DVD'].net_kwargs()).to(CUDA).eval()
    with torch.no_grad(), torch.autocast('cuda', dtype=torch.bfloat16):
        net(_rand(1, 12, 3, 256, 256))
    assert 0 < layers_window.MASK_CACHE.nbytes(CUDA) <= layers_window.MASK_CACHE_BYTES
    layers_window.MASK_CACHE.clear()


# -------------------------------------------------------------------------------------------------- metrics
def test_metric_networks_batch_frames_on_cuda_and_score_a_cut_clip_as_the_whole(tmp_path: Path) -> None:
    """On a GPU the metric networks take several frames a forward (utils.metrics.scorer.frames_per_forward); a clip
    cut into chunks and a primed segment still score as the whole clip, bit for bit, and as the CPU does."""
    from tests.support.metric_data import make_weights
    from utils.metrics import resolve
    from utils.metrics.scorer import MetricSuite

    weights = make_weights(str(tmp_path))
    specs = resolve(['lpips', 'dists', 'tlp'], True)
    suite = MetricSuite(specs, CUDA, weights, verify=False)
    out, gt = _rand(10, 3, 96, 128, seed=1, device=torch.device('cpu')), _rand(10, 3, 96, 128, seed=2,
                                                                                 device=torch.device('cpu'))
    calls = []
    net = suite.nets['lpips']
    hook = net.register_forward_pre_hook(lambda _m, args: calls.append(args[0].shape[0]))
    whole = suite.scorer().update(out, gt, 0)
    hook.remove()
    assert calls and set(calls) == {8}  # 10 frames of 96 x 128: one batch of 8 and a padded remainder
    chunked = suite.scorer()
    assert [r for a, b in ((0, 3), (3, 4), (4, 10)) for r in chunked.update(out[a:b], gt[a:b], a)] == whole
    segment = suite.scorer()
    segment.prime(out[4], gt[4], index=4)
    assert segment.update(out[5:], gt[5:], 5) == whole[5:]
    on_cpu = MetricSuite(specs, 'cpu', weights, verify=False).scorer().update(out, gt, 0)
    # tLP is 100 x the difference of two LPIPS distances, so it carries 100x their rounding (H100: 4.3e-4 at 2.95,
    # LPIPS 5e-7 at 4.19)
    tolerance = {'lpips': 1e-5, 'dists': 1e-5, 'tlp': 1e-3}
    for row, cpu in zip(whole, on_cpu):
        assert all(abs(row[k] - cpu[k]) <= tolerance[k] * max(1.0, abs(cpu[k])) for k in cpu), (row, cpu)
