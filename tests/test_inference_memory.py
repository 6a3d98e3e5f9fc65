"""Host memory of inference (issue 25 item 7): what a tile costs does not blow up with the frame size.

A 64-frame 320 x 180 video at x2 with the demo's VRT and ``--tile 16 0 0`` peaked at 6.3 GiB: the deformable
alignment built its sampled columns for every frame at once (1.4 GB, and as much for their modulated copy), the
shifted windows added their shift mask to the relative-position bias for every window (``windows x heads x N x N``),
and SpyNet and the upsampling head ran every frame at once. These tests check each part stays bounded (by the sizes
of what is allocated, and by the peak resident memory of a child process), that the outputs are the same bits, and
that a CPU run picks a tile that fits a laptop when none is given.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from torch import Tensor
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from engine import eval_setup
from models import layers_deform_conv, memory_plan, network_spynet, network_vrt
from models.layers_attention import TMSA, TMSAG
from models.layers_sdpa import record_attention_calls
from models.layers_window import compute_mask
from models.net_io import NetIO

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.usefixtures('one_thread')


class _LargestAllocation(TorchDispatchMode):
    """The largest tensor an operator creates inside the block (outputs that alias an input are not counted)."""

    def __init__(self) -> None:
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {t.untyped_storage().data_ptr() for t in tree_leaves((args, kwargs)) if isinstance(t, Tensor)}
        for t in tree_leaves(out):
            if isinstance(t, Tensor) and t.untyped_storage().data_ptr() not in inputs:
                self.largest = max(self.largest, t.untyped_storage().nbytes())
        return out


@pytest.mark.parametrize('grad', [False, True])
def test_deformable_columns_stay_within_their_budget(grad: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """The sampled deformable convolution builds its columns in pieces of at most ``DEFORM_COLUMNS_BYTES``: in
    inference and in training (each piece recomputed in backward); the output is the same bits as in one piece. In
    backward a piece's gradient of a sliced input is as large as that input (the gradient the caller gets anyway), so
    the bound is the budget or the largest input, whichever is larger: both far below the columns."""
    gen = torch.Generator().manual_seed(0)
    n, cin, cout, h, w, groups = 4, 32, 16, 64, 64, 2
    x = torch.rand(n, cin, h, w, generator=gen)
    offset = 3 * torch.randn(n, 2 * groups * 9, h, w, generator=gen)
    mask = torch.randn(n, groups * 9, h, w, generator=gen)
    weight, bias = 0.1 * torch.randn(cout, cin, 3, 3, generator=gen), torch.randn(cout, generator=gen)
    columns = n * cin * 9 * h * w * 4  # 18.9 MB in one piece

    def run(budget: int) -> tuple[Tensor, list[Tensor | None], int]:
        monkeypatch.setattr(layers_deform_conv, 'DEFORM_COLUMNS_BYTES', budget)
        leaves = [t.clone().requires_grad_(grad) for t in (x, offset, mask, weight, bias)]
        with torch.set_grad_enabled(grad), _LargestAllocation() as seen:
            out = layers_deform_conv.modulated_deform_conv3x3(*leaves, impl='sampled')
            if grad:
                out.sum().backward()
        return out.detach(), [t.grad for t in leaves], seen.largest

    whole, whole_grads, _ = run(2**40)
    out, grads, largest = run(2**20)
    assert torch.equal(out, whole)
    for g, expected in zip(grads, whole_grads):  # sums over the pieces: rounding only
        assert (g is None) == (not grad)
        if grad:
            torch.testing.assert_close(g, expected, rtol=1e-5, atol=1e-5)
    bound = max(2 * 2**20, max(t.nbytes for t in (x, offset, mask)))  # 2.4 MB: the offsets
    assert largest <= bound < columns // 4, largest


def test_shifted_windows_attend_without_the_dense_bias() -> None:
    """A shifted block attends in groups of windows that share one mask: the 49 of 64 windows inside the shift
    border with the relative-position bias alone, the 15 on it in three groups (last row, last column, corner), each
    with one ``(heads, N, N)`` bias + mask broadcast over its windows, never a ``windows x heads x N x N`` one; the
    output is the dense mask's bit for bit."""
    torch.manual_seed(0)
    heads, window = 2, (2, 8, 8)
    group = TMSAG(dim=16, depth=2, num_heads=heads, window_size=window, mut_attn=False, qkv_bias=True).eval()
    x = torch.randn(1, 2, 64, 64, 16, generator=torch.Generator().manual_seed(1))
    n = 2 * 8 * 8
    with torch.no_grad(), record_attention_calls() as calls:
        out = group(x)
    shifted = calls[1:]  # block 0 is unshifted
    assert sorted(c['q'][0] for c in shifted) == [1, 7, 7, 49]
    assert all(c['mask'] == (1, heads, n, n) for c in shifted)
    dense = compute_mask(2, 64, 64, (2, 8, 8), (0, 4, 4), x.device)  # the depth axis is not shifted (2 frames)
    with torch.no_grad():
        y = group.blocks[0](x, None)
        expected = TMSA.forward(group.blocks[1], y, dense)
    assert torch.equal(out, expected)
    assert sum(math.prod(c['mask']) for c in shifted if c['mask']) < 64 * heads * n * n


def _demo_sr2() -> dict:
    """The demo's VRT constructor arguments as an x2 super-resolution network."""
    from utils.utils_option import load_json

    kwargs = {k: v for k, v in load_json(str(ROOT / 'options/vrt/000_train_vrt_demo.json'))['netG'].items()
              if k != 'net_type'}
    kwargs.update(upscale=2, nonblind_denoising=False)
    return kwargs


def test_spynet_and_head_in_pieces_give_the_same_bits(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without autograd SpyNet's frame pairs and the upsampling head's frames go through in pieces (one frame each
    here); the restored clip is the same bits as in one piece. On the CPU the head's budget is
    ``CPU_HEAD_CHUNK_BYTES`` (``HEAD_CHUNK_BYTES`` is the other devices')."""
    from models.select_network import define_network

    torch.manual_seed(0)
    net = define_network('vrt', _demo_sr2()).eval()
    calls = []
    net.conv_before_upsample.register_forward_hook(lambda m, i, o: calls.append(i[0].shape[0]))
    x = torch.rand(1, 4, 3, 64, 64, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        monkeypatch.setattr(network_vrt, 'HEAD_CHUNK_BYTES', 1)  # not read on the CPU
        whole = net(x)
        assert calls == [4]
        monkeypatch.setattr(network_spynet, 'INFERENCE_CHUNK_BYTES', 1)
        monkeypatch.setattr(network_vrt, 'CPU_HEAD_CHUNK_BYTES', 1)
        pieces = net(x)
    assert calls == [4, 1, 1, 1, 1]
    assert torch.equal(pieces, whole)


CHILD = textwrap.dedent('''
    import json, sys, torch
    from models import layers_deform_conv, network_spynet, network_vrt
    from models.select_network import define_network
    torch.set_num_threads(1)
    for module, name in ((layers_deform_conv, 'DEFORM_COLUMNS_BYTES'), (network_spynet, 'INFERENCE_CHUNK_BYTES'),
                         (network_vrt, 'CPU_HEAD_CHUNK_BYTES')):
        setattr(module, name, 4 * 2**20)
    torch.manual_seed(0)
    net = define_network('vrt', json.loads(sys.argv[1])).eval()
    x = torch.rand(1, 8, 3, 96, 160)
    def status(key):
        return int(next(line for line in open('/proc/self/status') if line.startswith(key)).split()[1]) * 1024
    with torch.no_grad():
        net(x)  # warm-up: libraries, caches
        open('/proc/self/clear_refs', 'w').write('5')  # reset the peak resident size
        before = status('VmRSS:')
        net(x)
    print(json.dumps({'rise': status('VmHWM:') - before}))
''')


def test_demo_network_inference_peak_memory() -> None:
    """The demo's VRT as an x2 model on an 8-frame 96 x 160 clip (chunk budgets scaled down to 4 MB, so that the
    pieces show at this size): the forward's peak resident memory rises by less than 360 MiB (measured 274-276 MiB;
    with whole-clip columns, SpyNet and head, 482 MiB)."""
    # a fixed mmap threshold: freed activations go back to the system, so the resident peak follows the live tensors
    env = {'PYTHONPATH': str(ROOT), 'OMP_NUM_THREADS': '1', 'PATH': '/usr/bin:/bin', 'MALLOC_MMAP_THRESHOLD_': '65536'}
    done = subprocess.run([sys.executable, '-c', CHILD, json.dumps(_demo_sr2())], cwd=ROOT, capture_output=True,
                          text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    rise = json.loads(done.stdout.strip().splitlines()[-1])['rise']
    assert rise < 360 * 2**20, f'peak rise {rise / 2**20:.0f} MiB'


def test_cpu_default_tile_caps_the_whole_clip_and_frame() -> None:
    io = NetIO(scale=2, input_multiple=(2, 8, 8), temporal_tile=40)
    frames, size = memory_plan.CPU_TILE
    assert memory_plan.cpu_tile((0, 0), io) == (40, size)  # whole clip: the network's own tile; whole frame: capped
    assert memory_plan.cpu_tile((0, 0), NetIO()) == (frames, size)  # a network without a tile of its own
    assert memory_plan.cpu_tile((100, 128), io) == (100, 128)  # tiles given in numbers stay
    assert memory_plan.cpu_tile((0, 0), NetIO(input_multiple=(1, 24, 24)))[1] == size // 24 * 24
    assert memory_plan.cpu_tile((0, 0), NetIO(frame_interpolation=True, clip_frames=4))[0] == 0


@pytest.mark.parametrize(('device', 'tile', 'expected'), [
    ('cpu', None, (40, memory_plan.CPU_TILE[1])), ('cpu', [4, 64], (4, 64)), ('meta', None, (0, 0))])
def test_main_test_vrt_takes_the_cpu_tile_when_none_is_given(device: str, tile: list[int] | None,
                                                           expected: tuple[int, int], tmp_path: Path) -> None:
    """The demo's option file restores whole clips at whole frames (val.num_frame_testing / size_patch_testing 0):
    on the CPU, without ``--tile``, main_test_vrt.py takes the CPU tile instead."""
    from models.select_network import define_G
    from utils.utils_option import parse

    opt_file = ROOT / 'options' / 'vrt' / '000_train_vrt_demo.json'
    weights = tmp_path / 'G.pth'
    torch.save({'params': define_G(parse(str(opt_file), is_train=False)).state_dict()}, weights)
    args = eval_setup.build_parser().parse_args(['--opt', str(opt_file), '--model_path', str(weights),
                                                 '--device', device] + (['--tile', *map(str, tile)] if tile else []))
    assert eval_setup.setup_model(args).tile == tuple(expected)
