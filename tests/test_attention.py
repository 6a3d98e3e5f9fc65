"""Window attention on the CUDA path, checked on the CPU: head-dim padding (the fused kernels' alignment), chunking
of the folded window x head axis (the CUDA grid limit) and the byte-bounded shift-mask cache.

The padded and chunked paths are forced on the CPU (``PAD_HEAD_DIM_ON_CPU``, a small ``MAX_FOLDED``) and compared
with the plain path; the calls that reach SDPA are recorded to show that the forced path really ran.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator

import pytest
import torch
from torch import Tensor
from torch.utils._python_dispatch import TorchDispatchMode

from models import layers_attention, layers_linear, layers_sdpa, layers_window
from models.layers_attention import TMSAG, MlpGEGLU, WindowAttention
from models.layers_sdpa import attention, record_attention_calls
from models.layers_window import compute_mask, compute_shift_mask, window_partition, window_reverse
from models.model_zoo import TASKS
from models.network_rvrt import RVRT
from models.network_vrt import VRT

pytestmark = pytest.mark.usefixtures('one_thread')


@pytest.fixture()
def sdpa_calls() -> Iterator[list[dict]]:
    """Every call that reaches SDPA (or the CPU bias-gradient attention): shapes, kernel, eligibility."""
    with record_attention_calls() as calls:
        yield calls


def _grads(fn: Callable[..., Tensor], inputs: list[Tensor]) -> list[Tensor]:
    """fn's output and the gradients of a fixed random projection of it w.r.t. every input."""
    leaves = [t.detach().clone().requires_grad_() for t in inputs]
    out = fn(*leaves)
    out.backward(torch.randn(out.shape, generator=torch.Generator().manual_seed(9), dtype=out.dtype))
    return [out.detach()] + [t.grad for t in leaves]


def _assert_close_all(a: list[Tensor], b: list[Tensor], rel: float, names: list[str]) -> None:
    """Each pair agrees within ``rel`` of the larger tensor's largest magnitude (fp32 rounding)."""
    for name, x, y in zip(names, a, b):
        assert x.shape == y.shape, name
        err = (x - y).abs().max().item()
        bound = rel * max(y.abs().max().item(), 1e-30)
        assert err <= bound, f'{name}: max error {err:.2e} > {bound:.2e}'


def _qkv_mask(heads: int, n: int, hd: int, batch: int = 1, seed: int = 0) -> list[Tensor]:
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(batch, heads, n, hd, generator=gen) for _ in range(3))
    mask = 0.5 * torch.randn(1, heads, n, n, generator=gen)
    mask[..., : n // 3, n // 2:] = -100.0  # shift-mask entries on top of a relative-position bias
    return [q, k, v, mask]


# ----------------------------------------------------------------------------------------- head-dim padding
@pytest.mark.parametrize('hd', [20, 30])
@pytest.mark.parametrize('trainable_mask', [True, False])
def test_padded_head_dim_equals_unpadded(hd: int, trainable_mask: bool, monkeypatch: pytest.MonkeyPatch,
                                         sdpa_calls: list[dict]) -> None:
    """Zero columns change nothing: output and the q, k, v and mask gradients agree to fp32 rounding."""
    inputs = _qkv_mask(heads=6, n=32, hd=hd)
    scale = hd**-0.5
    names = ['output', 'grad q', 'grad k', 'grad v', 'grad mask']
    if trainable_mask:
        fn = lambda q, k, v, m: attention(q, k, v, m, scale)  # noqa: E731
    else:  # a fixed shift mask (mutual attention): SDPA's own backward
        fixed = inputs.pop()
        fn = lambda q, k, v: attention(q, k, v, fixed, scale)  # noqa: E731
        names.pop()
    plain = _grads(fn, inputs)
    assert [c['q'][-1] for c in sdpa_calls] == [hd]
    monkeypatch.setattr(layers_sdpa, 'PAD_HEAD_DIM_ON_CPU', True)
    padded = _grads(fn, inputs)
    assert sdpa_calls[-1]['q'][-1] == -(-hd // 8) * 8 and sdpa_calls[-1]['scale'] == scale
    _assert_close_all(padded, plain, 2e-6, names)


@pytest.mark.parametrize(('dim', 'heads'), [(120, 6), (180, 6)])
def test_window_attention_padded_equals_unpadded(dim: int, heads: int, monkeypatch: pytest.MonkeyPatch,
                                                 sdpa_calls: list[dict]) -> None:
    """VRT's blocks (head dims 20 and 30) with shifted windows and mutual attention: output and the gradients of
    the input, the relative-position bias table and the q/k/v projections agree to fp32 rounding."""
    torch.manual_seed(0)
    attn = WindowAttention(dim, (2, 4, 4), heads, qkv_bias=True, mut_attn=True)
    mask = compute_mask(4, 8, 8, (2, 4, 4), (1, 2, 2), torch.device('cpu'))  # 8 windows of 32 tokens
    x = torch.randn(8, 32, dim, generator=torch.Generator().manual_seed(1))
    names = ['output', 'grad x', 'relative_position_bias_table', 'qkv_self.weight', 'qkv_mut.weight']

    def run() -> list[Tensor]:
        attn.zero_grad(set_to_none=True)
        out, grad_x = _grads(lambda t: attn(t, mask), [x])
        return [out, grad_x, attn.relative_position_bias_table.grad.clone(), attn.qkv_self.weight.grad.clone(),
                attn.qkv_mut.weight.grad.clone()]

    plain = run()
    monkeypatch.setattr(layers_sdpa, 'PAD_HEAD_DIM_ON_CPU', True)
    sdpa_calls.clear()
    padded = run()
    assert {c['q'][-1] for c in sdpa_calls} == {-(-dim // heads // 8) * 8}
    _assert_close_all(padded, plain, 2e-6, names)


# -------------------------------------------------------------------------------------------------- chunking
@pytest.mark.parametrize(('batch', 'heads', 'limit'), [(1, 23, 5), (11, 3, 4), (7, 9, 3)])
def test_chunked_attention_equals_unchunked(batch: int, heads: int, limit: int, monkeypatch: pytest.MonkeyPatch,
                                            sdpa_calls: list[dict]) -> None:
    inputs = _qkv_mask(heads=heads, n=16, hd=8, batch=batch)
    fn = lambda q, k, v, m: attention(q, k, v, m, 0.3)  # noqa: E731
    whole = _grads(fn, inputs)
    assert len(sdpa_calls) == 1
    monkeypatch.setattr(layers_sdpa, 'MAX_FOLDED', limit)
    sdpa_calls.clear()
    chunked = _grads(fn, inputs)
    assert len(sdpa_calls) > 1
    assert all(c['q'][0] <= limit and c['q'][1] <= limit and c['mask'][1] == c['q'][1] for c in sdpa_calls)
    assert sum(c['q'][0] * c['q'][1] for c in sdpa_calls) == batch * heads
    _assert_close_all(chunked, whole, 1e-6, ['output', 'grad q', 'grad k', 'grad v', 'grad mask'])


# ------------------------------------------------------------------- the CPU backward of a trainable bias
@pytest.mark.parametrize(('batch', 'heads', 'chunk'), [(7, 3, 2 * 3 * 256), (2, 5, 2 * 256)],
                         ids=['samples-per-chunk', 'head-spans'])
def test_bias_backward_equals_autograd_of_the_formula(batch: int, heads: int, chunk: int,
                                                      monkeypatch: pytest.MonkeyPatch, sdpa_calls: list[dict]) -> None:
    """The recomputing backward of a trainable bias, cut into chunks of several whole samples (7 = 2 + 2 + 2 + 1,
    the bias gradient summed over each chunk's samples) or into spans of one sample's heads (5 = 2 + 2 + 1): the
    output and the q, k, v and bias gradients agree with autograd through softmax(q k^T s + bias) v in float64."""
    monkeypatch.setattr(layers_sdpa._BiasedAttention, '_CHUNK_ELEMENTS', chunk)  # N = 16: 256 scores per head
    inputs = _qkv_mask(heads=heads, n=16, hd=8, batch=batch)
    upstream = torch.randn(batch, heads, 16, 8, generator=torch.Generator().manual_seed(9))

    def run(fn: Callable[..., Tensor], dtype: torch.dtype) -> list[Tensor]:
        leaves = [t.to(dtype, copy=True).requires_grad_() for t in inputs]
        out = fn(*leaves)
        out.backward(upstream.to(dtype))
        return [t.float() for t in [out.detach()] + [t.grad for t in leaves]]

    got = run(lambda q, k, v, m: attention(q, k, v, m, 0.3), torch.float32)
    assert [c['path'] for c in sdpa_calls] == ['biased']
    expected = run(lambda q, k, v, m: (q @ k.transpose(-2, -1) * 0.3 + m).softmax(-1) @ v, torch.float64)
    _assert_close_all(got, expected, 2e-6, ['output', 'grad q', 'grad k', 'grad v', 'grad mask'])


def test_bias_backward_in_parts_on_worker_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    """At two OpenMP threads the backward cuts the samples into two parts (each in chunks of whole samples, 7 =
    (2 + 2) + (2 + 1)) and runs them at once on two worker threads of one OpenMP thread each: the gradients agree
    with autograd through the formula in float64, equal bit for bit the same parts run one after another (as under
    a dispatch mode) but for denormals, and the caller and threads started later keep two threads. The workers
    flush denormals to zero (a shift mask's -100 makes probabilities of ~1e-44); the caller keeps them."""
    monkeypatch.setattr(layers_sdpa._BiasedAttention, '_PART_CHUNK_ELEMENTS', 2 * 3 * 256)  # N = 16: 2 samples
    monkeypatch.setattr(layers_sdpa._BiasedAttention, '_PARTS_ABOVE', 0)
    inputs = _qkv_mask(heads=3, n=16, hd=8, batch=7)
    upstream = torch.randn(7, 3, 16, 8, generator=torch.Generator().manual_seed(9))
    seen: list[tuple[str, int, range]] = []
    part = layers_sdpa._BiasedAttention._part
    both = threading.Barrier(2, timeout=60)  # the parts on workers must be running at the same time

    def recording(tensors, grads, grad_bias, rows, *rest):
        seen.append((threading.current_thread().name, torch.get_num_threads(), range(rows.start, rows.stop),
                     _flushes_denormals()))
        if threading.current_thread() is not threading.main_thread():
            both.wait()  # also keeps one worker from taking both parts when the first ends quickly
        part(tensors, grads, grad_bias, rows, *rest)

    monkeypatch.setattr(layers_sdpa._BiasedAttention, '_part', staticmethod(recording))

    def run(fn: Callable[..., Tensor], dtype: torch.dtype) -> list[Tensor]:
        leaves = [t.to(dtype, copy=True).requires_grad_() for t in inputs]
        fn(*leaves).backward(upstream.to(dtype))
        return [t.grad.float() for t in leaves]

    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        parallel = run(lambda q, k, v, m: attention(q, k, v, m, 0.3), torch.float32)
        workers, seen[:] = list(seen), []
        with _Noop():  # a dispatch mode is thread-local: the parts then run here, one after another
            serial = run(lambda q, k, v, m: attention(q, k, v, m, 0.3), torch.float32)
        later: list[int] = []  # a thread started afterwards takes the process default, which must still be 2
        probe = threading.Thread(target=lambda: later.append(torch.get_num_threads()))
        probe.start()
        probe.join()
        assert torch.get_num_threads() == 2 and later == [2]
    finally:
        torch.set_num_threads(threads)
    assert sorted((r.start, r.stop) for _, _, r, _ in workers) == [(0, 4), (4, 7)]
    assert all(name.startswith('attention-backward') and count == 1 for name, count, _, _ in workers), workers
    assert len({name for name, _, _, _ in workers}) == 2
    assert all(name == threading.main_thread().name for name, _, _, _ in seen) and len(seen) == 2
    assert all(flush for *_, flush in workers) and not any(flush for *_, flush in seen) and not _flushes_denormals()
    # the -100 of the shift mask makes denormal terms: 0 on the workers, kept here; every other bit is the same
    assert not torch.equal(serial[3], _flushed(serial[3]))
    for name, a, b in zip(['grad q', 'grad k', 'grad v', 'grad mask'], parallel, serial):
        assert torch.equal(a, _flushed(b)), name
    expected = run(lambda q, k, v, m: (q @ k.transpose(-2, -1) * 0.3 + m).softmax(-1) @ v, torch.float64)
    _assert_close_all(parallel, expected, 2e-6, ['grad q', 'grad k', 'grad v', 'grad mask'])


def _flushed(t: Tensor) -> Tensor:
    """``t`` with its denormal entries set to zero."""
    return t.masked_fill(t.abs() < torch.finfo(t.dtype).tiny, 0.0)


def _flushes_denormals() -> bool:
    """Whether this thread's float ops flush denormals to zero (1e-40 is a float32 denormal)."""
    return torch.tensor(1e-40).mul(1.0).item() == 0.0


class _Noop(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def test_shifted_window_gather_equals_roll_and_partition(fresh_cache) -> None:
    """The one-gather shifted-window partition and its reverse give roll + partition's values, and their backward
    the roll + partition backward's gradients (a permutation each way: bit for bit)."""
    window, shift, size = (2, 4, 4), (1, 2, 2), (2, 4, 8, 12)
    x = torch.randn(*size, 3, generator=torch.Generator().manual_seed(3))
    upstream = torch.randn(2 * 2 * 2 * 3, 32, 3, generator=torch.Generator().manual_seed(4))

    def through(partition: Callable[[Tensor], Tensor], reverse: Callable[[Tensor], Tensor]) -> list[Tensor]:
        leaf, windows_leaf = x.clone().requires_grad_(), upstream.clone().requires_grad_()
        windows, back = partition(leaf), reverse(windows_leaf)
        windows.backward(upstream)
        back.backward(x)
        assert torch.equal(reverse(partition(x)), x)
        return [windows.detach(), back.detach(), leaf.grad, windows_leaf.grad]

    expected = through(lambda t: window_partition(torch.roll(t, (-1, -2, -2), (1, 2, 3)), window),
                       lambda w: torch.roll(window_reverse(w, window, *size), shift, (1, 2, 3)))
    got = through(lambda t: layers_window.shifted_window_partition(t, window, shift),
                  lambda w: layers_window.shifted_window_reverse(w, window, shift, *size))
    for name, e, g in zip(['windows', 'reversed', 'grad x', 'grad windows'], expected, got):
        assert torch.equal(e, g), name


def test_grouped_windows_equal_the_dense_mask_path(monkeypatch: pytest.MonkeyPatch, fresh_cache) -> None:
    """Shifted windows gathered in the compact mask's groups (every sample's unmasked windows, then every sample's
    masked ones: slices) give the dense mask's output, and its gradients up to the order of the sums over tokens;
    two samples, so that a group mixing them up would show."""
    torch.manual_seed(0)
    group = TMSAG(dim=8, depth=2, num_heads=2, window_size=(2, 4, 4), mut_attn=True, qkv_bias=True).train()
    x = torch.randn(2, 4, 8, 12, 8, generator=torch.Generator().manual_seed(2))

    def run() -> list[Tensor]:
        group.zero_grad(set_to_none=True)
        out, grad_x = _grads(group, [x])
        return [out, grad_x] + [p.grad.clone() for p in group.parameters()]

    grouped = run()
    keys = {k[0] for k in fresh_cache.keys()}
    assert {'windows', 'grouped'} <= keys  # the compact mask and the grouped order ran
    monkeypatch.setattr(layers_attention, 'compute_shift_mask', compute_mask)  # what an ONNX graph takes
    dense = run()
    assert torch.equal(grouped[0], dense[0])
    # each path's gradients lie within 6.1e-7 of a float64 run's (relative to the largest entry), in opposite
    # directions: 1.15e-6 apart on an AMD EPYC (AVX2), where the sums over tokens run in other blocks
    _assert_close_all(grouped[1:], dense[1:], 2e-6, ['grad x'] + [n for n, _ in group.named_parameters()])


def test_spans_are_balanced_and_cover() -> None:
    spans = layers_sdpa._spans(73728, 65535)
    assert [s.stop - s.start for s in spans] == [36864, 36864]
    assert layers_sdpa._spans(5, 5) == [slice(0, 5)]
    spans = layers_sdpa._spans(23, 5)
    assert spans[0].start == 0 and spans[-1].stop == 23 and all(a.stop == b.start for a, b in zip(spans, spans[1:]))
    assert max(s.stop - s.start for s in spans) <= 5


def test_shifted_mutual_group_chunked_and_padded_equals_plain(monkeypatch: pytest.MonkeyPatch,
                                                              sdpa_calls: list[dict]) -> None:
    """A TMSA group with shifted windows and mutual attention whose batch (windows) and folded head (2 frames x
    heads) axes are above a forced-small limit, with the head dim padded too: output and parameter gradients as
    the plain path."""
    torch.manual_seed(0)
    group = TMSAG(dim=20, depth=2, num_heads=2, window_size=(2, 4, 4), mut_attn=True, qkv_bias=True)  # hd 10
    x = torch.randn(1, 4, 12, 12, 20, generator=torch.Generator().manual_seed(2))

    def run() -> list[Tensor]:
        group.zero_grad(set_to_none=True)
        out, grad_x = _grads(group, [x])
        return [out, grad_x] + [p.grad.clone() for p in group.parameters()]

    names = ['output', 'grad x'] + [n for n, _ in group.named_parameters()]
    plain = run()
    # the 18 windows go along the batch axis (the shifted blocks' in groups sharing one mask), and the mutual
    # attention folds 2 frames x 2 heads
    assert max(c['q'][0] for c in sdpa_calls) == 18 and max(c['q'][1] for c in sdpa_calls) == 2 * 2
    monkeypatch.setattr(layers_sdpa, 'MAX_FOLDED', 3)
    monkeypatch.setattr(layers_sdpa, 'PAD_HEAD_DIM_ON_CPU', True)
    sdpa_calls.clear()
    forced = run()
    assert all(c['q'][0] <= 3 and c['q'][1] <= 3 and c['q'][-1] == 16 for c in sdpa_calls)
    _assert_close_all(forced, plain, 2e-6, names)


# ------------------------------------------------------------------------------------------- shift-mask cache
def _reference_mask(d: int, h: int, w: int, window: tuple, shift: tuple) -> Tensor:
    """The shift mask as first written (region ids, pairwise differences, -100 where they differ)."""
    img = torch.zeros(1, d, h, w, 1)
    cnt = 0
    for sd in (slice(-window[0]), slice(-window[0], -shift[0]), slice(-shift[0], None)):
        for sh in (slice(-window[1]), slice(-window[1], -shift[1]), slice(-shift[1], None)):
            for sw in (slice(-window[2]), slice(-window[2], -shift[2]), slice(-shift[2], None)):
                img[:, sd, sh, sw, :] = cnt
                cnt += 1
    ids = window_partition(img, window).squeeze(-1)
    diff = ids.unsqueeze(1) - ids.unsqueeze(2)
    return diff.masked_fill(diff != 0, -100.0).masked_fill(diff == 0, 0.0)


@pytest.fixture()
def fresh_cache(monkeypatch: pytest.MonkeyPatch):
    layers_window.MASK_CACHE.clear()
    yield layers_window.MASK_CACHE
    layers_window.MASK_CACHE.clear()


SIZES = [((4, 8, 8), (2, 4, 4), (1, 2, 2)), ((6, 16, 8), (6, 8, 8), (3, 4, 4)), ((2, 16, 16), (2, 8, 8), (1, 4, 4)),
         ((4, 12, 20), (2, 4, 4), (1, 2, 2))]


@pytest.mark.parametrize(('size', 'window', 'shift'), SIZES)
def test_mask_values_unchanged(size: tuple, window: tuple, shift: tuple, fresh_cache) -> None:
    cpu = torch.device('cpu')
    expected = _reference_mask(*size, window, shift)
    first = compute_mask(*size, window, shift, cpu)
    assert torch.equal(first, expected) and first.dtype == torch.float32
    assert compute_mask(*size, window, shift, cpu) is first  # cached
    compact = compute_shift_mask(*size, window, shift, cpu)
    assert torch.equal(compact.dense(), expected)
    groups = compact.groups()  # the all-zero windows, then one group per distinct mask, each sharing its mask
    assert sorted(torch.cat([index for index, _ in groups]).tolist()) == list(range(expected.shape[0]))
    assert not expected[groups[0][0]].any()
    assert all((expected[index] == mask).all() for index, mask in groups[1:])
    assert len({tuple(mask.flatten().tolist()) for _, mask in groups[1:]}) == len(groups) - 1 <= 7


def test_mask_cache_bounded_per_device_lru(monkeypatch: pytest.MonkeyPatch, fresh_cache) -> None:
    cpu, meta = torch.device('cpu'), torch.device('meta')
    nbytes = [_reference_mask(*s, w, sh).numel() * 4 for s, w, sh in SIZES]
    budget = nbytes[0] + nbytes[1] + nbytes[2] // 2  # room for the first two, not for a third
    monkeypatch.setattr(layers_window, 'MASK_CACHE_BYTES', budget)
    a = compute_mask(*SIZES[0][0], *SIZES[0][1:], cpu)
    compute_mask(*SIZES[1][0], *SIZES[1][1:], cpu)
    compute_mask(*SIZES[0][0], *SIZES[0][1:], cpu)  # touch: size 1 becomes the least recently used
    on_meta = compute_mask(*SIZES[1][0], *SIZES[1][1:], meta)  # another device: its own budget
    assert on_meta.device == meta and fresh_cache.nbytes(meta) == nbytes[1]
    assert fresh_cache.nbytes(cpu) == nbytes[0] + nbytes[1]
    c = compute_mask(*SIZES[2][0], *SIZES[2][1:], cpu)  # evicts size 1, keeps size 0
    assert torch.equal(c, _reference_mask(*SIZES[2][0], *SIZES[2][1:]))
    cpu_keys = [k[:3] for k in fresh_cache.keys() if k[-1] == cpu]
    assert cpu_keys == [SIZES[0][0], SIZES[2][0]]
    assert fresh_cache.nbytes(cpu) <= budget
    assert compute_mask(*SIZES[0][0], *SIZES[0][1:], cpu) is a
    assert fresh_cache.nbytes(meta) == nbytes[1]  # untouched by the CPU's evictions


def test_mask_above_budget_is_built_but_not_kept(monkeypatch: pytest.MonkeyPatch, fresh_cache) -> None:
    monkeypatch.setattr(layers_window, 'MASK_CACHE_BYTES', 1000)
    size, window, shift = SIZES[1]
    mask = compute_mask(*size, window, shift, torch.device('cpu'))
    assert torch.equal(mask, _reference_mask(*size, window, shift))
    assert fresh_cache.keys() == [] and fresh_cache.nbytes(torch.device('cpu')) == 0


def test_mask_made_during_inference_serves_training(fresh_cache, monkeypatch: pytest.MonkeyPatch) -> None:
    """Validation (inference mode) builds the mask first; the next training step uses the cached one."""
    # inference's linears ATen's too, as training's: oneDNN's (layers_linear) rounds otherwise on AVX2 CPUs for 8
    # output features (benchmarks/RESULTS.md, "Training layout on AVX2")
    monkeypatch.setattr(layers_linear, '_fast', lambda module, x: False)
    torch.manual_seed(0)
    group = TMSAG(dim=8, depth=2, num_heads=2, window_size=(2, 4, 4), mut_attn=True, qkv_bias=True)
    x = torch.randn(1, 4, 8, 8, 8)
    with torch.inference_mode():
        expected = group(x)
    # the mask, the shifted-window gather and its grouped form (the one the blocks take)
    assert sorted(k[0] for k in fresh_cache.keys()) == ['grouped', 'order', 'windows']
    key = next(k for k in fresh_cache.keys() if k[0] == 'windows')
    cached = compute_shift_mask(*key[1:])
    order = layers_window.window_order(*key[1:])
    grouped = layers_window.grouped_window_order(1, *key[1:])
    # an inference tensor could not be saved for backward by a later step
    assert not any(t.is_inference() for t in (cached.masks, cached.masked, cached.unmasked, order, grouped))
    out = group(x)
    out.square().mean().backward()
    assert torch.equal(out.detach(), expected)
    assert group.blocks[1].attn.relative_position_bias_table.grad is not None


# ------------------------------------------------------------------------- the CUDA path on the meta device
# The meta device takes the non-CPU branches (padding, SDPA with a trainable mask, native sampling backward) at the
# released models' full sizes without computing anything; the recorded calls show what the CUDA kernels would get.
# tests/test_deterministic_ops.py runs tiny networks there in deterministic mode; these run the released settings
# with the default (non-deterministic) kernels.
def _released(task: str) -> torch.nn.Module:
    spec = TASKS[task]
    with torch.device('meta'):
        return (VRT if spec.net_type == 'vrt' else RVRT)(**spec.net_kwargs())


def _assert_fused_eligible(calls: list[dict]) -> None:
    assert calls
    for call in calls:
        assert call['blockers'] == [] and call['q'][-1] % 8 == 0 and call['path'] == 'sdpa', call


def test_meta_vrt_001_train_step_takes_fused_kernels() -> None:
    """VRT 001 at its training clip (6 x 64 x 64): head dims 20 and 30 reach SDPA as 24 and 32, the trainable
    relative-position bias goes to SDPA itself (not the CPU recompute), and every parameter gets a gradient."""
    net = _released('001_VRT_videosr_bi_REDS_6frames').train()
    with record_attention_calls() as calls:
        out = net(torch.rand(1, 6, 3, 64, 64, device='meta'))
        out.square().mean().backward()
    _assert_fused_eligible(calls)
    assert {c['q'][-1] for c in calls} == {24, 32}
    assert any(c['mask_grad'] for c in calls) and any(c['mask'] is None for c in calls)
    assert all(p.grad is not None for p in net.parameters())


def test_meta_vrt_deblur_validation_tile_is_chunked() -> None:
    """A 12 x 1024 x 1024 tile of the deblurring recipes: every call stays within the CUDA grid limit. Stage 8's
    per-frame (1 x 8 x 8) shifted windows that do not straddle the shift border, 12 x 127 x 127 = 193,548, go along
    the batch axis and arrive as three calls of 64,516."""
    net = _released('005_VRT_videodeblurring_DVD').eval()
    with record_attention_calls() as calls, torch.no_grad():
        out = net(torch.rand(1, 12, 3, 1024, 1024, device='meta'))
    assert out.shape == (1, 12, 3, 1024, 1024)
    _assert_fused_eligible(calls)
    assert max(max(c['q'][:2]) for c in calls) == 64516
    assert sum(c['q'][0] == 64516 and c['mask'] is not None for c in calls) >= 3


def test_meta_rvrt_001_train_step(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(RVRT, 'is_mirror_extended', staticmethod(lambda lqs: False))  # torch.equal: no meta kernel
    net = _released('001_RVRT_videosr_bi_REDS_30frames').train()
    with record_attention_calls() as calls:
        out = net(torch.rand(1, 4, 3, 64, 64, device='meta'))
        out.square().mean().backward()
    _assert_fused_eligible(calls)
    assert all(p.grad is not None for p in net.parameters())


class _OpNames(TorchDispatchMode):
    """The names of the ops dispatched inside it."""

    def __init__(self) -> None:
        super().__init__()
        self.names: set[str] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.add(str(func))
        return func(*args, **(kwargs or {}))


def test_geglu_without_autograd_runs_in_place_with_the_same_bits() -> None:
    """Without autograd the GEGLU MLP runs its GELU and product in place: the same output bits as the recording path
    (fp32 and bf16 autocast), and the in-place path is the one taken."""
    torch.manual_seed(0)
    mlp = MlpGEGLU(12, 24)
    x = torch.randn(2, 5, 7, 12)
    for autocast in (False, True):
        with torch.autocast('cpu', dtype=torch.bfloat16, enabled=autocast):
            recorded = mlp(x)
            with torch.no_grad(), _OpNames() as ops:
                eager = mlp(x)
        recorded.float().sum().backward()  # the recording path kept what its backward needs
        assert 'aten.gelu_.default' in ops.names
        assert torch.equal(eager, recorded.detach())


@pytest.mark.parametrize('ckpt', [False, True])
def test_dropped_branch_is_not_computed_and_gives_the_same_bits(ckpt: bool) -> None:
    """In CPU training a TMSA branch whose drop-path draw is 0 is not computed: output, input gradient, parameter
    gradients (zeros for the dropped branch) and the RNG stream equal timm's ``x + drop_path(branch(x))`` bit for
    bit, with and without checkpointing, over seeds that drop and keep each branch."""
    torch.manual_seed(0)
    blk = layers_attention.TMSA(12, 2, (2, 4, 4), (1, 2, 2), mut_attn=True, drop_path=0.5,
                                use_checkpoint_attn=ckpt, use_checkpoint_ffn=ckpt).train()
    x0 = torch.randn(1, 2, 8, 8, 12, generator=torch.Generator().manual_seed(1))
    mask = compute_shift_mask(2, 8, 8, (2, 4, 4), (1, 2, 2), x0.device)
    calls = {'attn': 0, 'mlp': 0}
    blk.attn.register_forward_pre_hook(lambda *_: calls.__setitem__('attn', calls['attn'] + 1))
    blk.mlp.register_forward_pre_hook(lambda *_: calls.__setitem__('mlp', calls['mlp'] + 1))

    def timm_forward(x: Tensor) -> Tensor:  # the branches always computed, then multiplied by the draw
        x = x + blk.drop_path(blk._attn_part(x, mask))
        return x + blk.drop_path(blk._ffn_part(x))

    def run(fn: Callable[[Tensor], Tensor], seed: int) -> list[Tensor | None]:
        blk.zero_grad(set_to_none=True)
        x = x0.clone().requires_grad_()
        torch.manual_seed(seed)
        out = fn(x)
        out.backward(torch.ones_like(out))
        return [out.detach(), x.grad, torch.get_rng_state(), *(p.grad for p in blk.parameters())]

    draws = []
    for seed in range(8):
        torch.manual_seed(seed)
        draws.append([torch.empty(1).bernoulli_(0.5).item() for _ in range(2)])  # attention's, then the MLP's
        before = dict(calls)
        ours = run(lambda x: blk(x, mask), seed)
        runs = 2 if ckpt else 1  # a checkpointed branch runs again in backward
        assert [calls[k] - before[k] for k in ('attn', 'mlp')] == [d * runs for d in draws[-1]], seed
        plain = run(timm_forward, seed)
        for i, (a, b) in enumerate(zip(ours, plain)):
            assert a is not None and torch.equal(a, b), (seed, i)
    assert {d[0] for d in draws} == {d[1] for d in draws} == {0.0, 1.0}  # each branch both dropped and kept
