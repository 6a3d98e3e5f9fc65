"""The reference RVRT (KAIR / JingyunLiang/RVRT) on the CPU, for side-by-side timing in ``bench_rvrt.py``.

The reference's ``models/op/deform_attn.py`` builds a CUDA extension when it is imported and its guided deformable
attention has no CPU kernel, so the reference network cannot run on a CPU as it is. :func:`load_reference` imports a
user's checkout unchanged under a private package name, with the extension build skipped and the module's
``deform_attn`` replaced by :func:`standin_deform_attn`: plain PyTorch ops with the CUDA kernel's semantics, written
here from that semantics (``models/layers_deform_attn.py`` states it), not from our operator, so that the two
implementations check each other. Everything else (the projections, the offset network, SpyNet, the backbones) is the
reference's own code. Two ways a user would write the two products run side by side: ``'sum'`` (broadcast products,
then sums) and ``'einsum'``; neither is faster in both the forward and the train step (benchmarks/RESULTS.md, "Issue
29 on the Intel Xeon again (Sapphire Rapids): session 11"), so ``bench_rvrt.py`` judges each measure against the
faster of the two.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import sys
import types
from collections.abc import Iterator
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

STANDINS = ('sum', 'einsum')


def standin_deform_attn(q: Tensor, kv: Tensor, offset: Tensor, kernel_h: int, kernel_w: int, stride: int = 1,
                        padding: int = 0, dilation: int = 1, attention_heads: int = 1, deformable_groups: int = 1,
                        clip_size: int = 1, *, products: str = 'sum') -> Tensor:
    """The reference operator's forward (its argument order), with autograd through plain ops.

    Args:
        q: (N * clip, 1, C, H, W) queries (any shape of N * clip * C * H * W elements).
        kv: (N, clip, 2C, H, W), keys then values along the channels, split into ``deformable_groups`` groups.
        offset: (N * clip, clip * G * kh * kw * 2, H, W): block ``n`` of query frame ``j`` samples kv frame
            ``(j + n) % clip``; in a block, group ``g`` and kernel point ``k`` hold (dy, dx) at channels
            ``(g * kh * kw + k) * 2 + {0, 1}``.
        products: ``'sum'`` or ``'einsum'``, how the logits and the weighted sum are written.

    Returns:
        q's shape: per head, softmax(q . k / sqrt(head_dim)) over the clip x kh x kw bilinear samples (zeros outside
        the frame, positions ``(2 p + 1) / size - 1``), times the sampled values.
    """
    n, clip, c2, h, w = kv.shape
    c, b, kk, hw = c2 // 2, n * clip, kernel_h * kernel_w, h * w
    groups, heads = deformable_groups, attention_heads
    frame = torch.arange(clip, device=kv.device)
    stack = kv[:, ((frame.view(-1, 1) + frame.view(1, -1)) % clip).flatten()]  # (N, clip * clip, 2C, H, W)
    rows = torch.arange(h, device=kv.device, dtype=q.dtype) * stride - padding
    cols = torch.arange(w, device=kv.device, dtype=q.dtype) * stride - padding
    ki = torch.arange(kernel_h, device=kv.device, dtype=q.dtype).repeat_interleave(kernel_w) * dilation
    kj = torch.arange(kernel_w, device=kv.device, dtype=q.dtype).repeat(kernel_h) * dilation
    off = offset.view(b, clip, groups, kk, 2, h, w)
    y = off[:, :, :, :, 0] + ki.view(kk, 1, 1) + rows.view(1, h, 1)
    x = off[:, :, :, :, 1] + kj.view(kk, 1, 1) + cols.view(1, 1, w)
    grid = torch.stack(((2 * x + 1) / w - 1, (2 * y + 1) / h - 1), dim=-1)  # (B, clip, G, kk, H, W, 2)
    samples = F.grid_sample(stack.reshape(b * clip * groups, c2 // groups, h, w),
                            grid.reshape(b * clip * groups, kk * h, w, 2), mode='bilinear', padding_mode='zeros',
                            align_corners=False).view(b, clip, c2, kk, hw)
    hd = c // heads
    keys = samples[:, :, :c].reshape(b, clip, heads, hd, kk, hw)
    values = samples[:, :, c:].reshape(b, clip, heads, hd, kk, hw)
    qh = q.reshape(b, heads, hd, hw) * hd**-0.5
    if products == 'einsum':
        logits = torch.einsum('bsedkp,bedp->beskp', keys, qh).reshape(b, heads, clip * kk, hw)
        attn = logits.softmax(dim=2).view(b, heads, clip, kk, hw)
        out = torch.einsum('bsedkp,beskp->bedp', values, attn)
    elif products == 'sum':
        logits = (keys * qh.view(b, 1, heads, hd, 1, hw)).sum(3)  # (B, clip, heads, kk, HW)
        attn = logits.transpose(1, 2).reshape(b, heads, clip * kk, hw).softmax(dim=2)
        attn = attn.view(b, heads, clip, kk, hw).transpose(1, 2).unsqueeze(3)  # (B, clip, heads, 1, kk, HW)
        out = (values * attn).sum(dim=(1, 4))
    else:
        raise ValueError(f'products={products!r}: use one of {STANDINS}')
    return out.reshape(q.shape)


def _package(name: str, path: Path) -> None:
    module = types.ModuleType(name)
    module.__path__ = [str(path)]
    sys.modules[name] = module


def _run_file(name: str, path: Path) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@contextlib.contextmanager
def _without_extension_builds() -> Iterator[None]:
    """``torch.utils.cpp_extension.load`` answers with an empty module while the reference is imported: its CUDA
    build is what cannot run here, and the stand-in replaces everything the build would provide."""
    import torch.utils.cpp_extension as ext
    real = ext.load
    ext.load = lambda *args, **kwargs: types.ModuleType('reference_extension_not_built')
    try:
        yield
    finally:
        ext.load = real


def _distutils_version() -> None:
    """The reference imports ``distutils.version.LooseVersion`` (gone from Python 3.12's standard library, kept by
    setuptools' shim); without either, an equivalent from ``packaging`` stands in."""
    try:
        import distutils.version  # noqa: F401
    except ImportError:
        from packaging.version import Version
        shim = types.ModuleType('distutils.version')
        shim.LooseVersion = Version
        sys.modules.setdefault('distutils', types.ModuleType('distutils')).version = shim
        sys.modules['distutils.version'] = shim


def load_reference(directory: str, products: str) -> type[nn.Module]:
    """The reference ``RVRT`` class from a checkout (``DIR/models/network_rvrt.py`` with ``models/op/deform_attn.py``,
    the layout of cszn/KAIR and JingyunLiang/RVRT), its attention computed by :func:`standin_deform_attn`."""
    root = Path(directory)
    pkg = next((p for p in (root / 'models', root) if (p / 'network_rvrt.py').is_file()), None)
    if pkg is None or not (pkg / 'op' / 'deform_attn.py').is_file():
        raise SystemExit(f'--reference-dir {directory}: no models/network_rvrt.py with models/op/deform_attn.py in '
                         f'it (a checkout of cszn/KAIR or JingyunLiang/RVRT)')
    name = f'_reference_rvrt_{products}'
    _package(name, pkg)
    _package(f'{name}.op', pkg / 'op')
    _distutils_version()
    with _without_extension_builds():
        op = _run_file(f'{name}.op.deform_attn', pkg / 'op' / 'deform_attn.py')
    # before the network's module is run: it binds the name at its import
    op.deform_attn = functools.partial(standin_deform_attn, products=products)
    return _run_file(f'{name}.network_rvrt', pkg / 'network_rvrt.py').RVRT
