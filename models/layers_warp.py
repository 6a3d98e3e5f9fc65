"""Flow-based warping, and the sampling, resizing and padding ops of VRT/RVRT with a deterministic backward.

On CUDA the backward of ``F.grid_sample``, of bilinear ``F.interpolate`` and of replicate/reflect ``F.pad``
accumulate with atomic adds (PyTorch raises under ``torch.use_deterministic_algorithms(True)``), and torchvision's
``deform_conv2d`` backward does so silently. Their forward kernels are deterministic. So where
:func:`deterministic_kernels` is True and autograd needs the op, the wrappers here (:func:`grid_sample`,
:func:`resize_bilinear`, :func:`pad`; the deformable layers sample through :func:`grid_sample`) run the native
forward kernel and a backward that sums in a fixed order: :func:`grid_sample_backward` (``index_add`` into a
channels-last view and ``index_select`` of the corner values; ``index_add`` is deterministic on CUDA in
deterministic mode and on the CPU), and the autograd of :func:`resize_bilinear_formulation` (``index_select``
taps) and :func:`pad_formulation` (slices and concatenations). The forward values are the native kernels' bits,
and only the op's inputs are kept for backward.

On the CPU the default kernels are deterministic at any thread count (a backward repeated at 1-4 threads gives
identical bits), so the switch is off there unless :func:`force_deterministic_kernels` forces it (tests).
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Callable, Iterator, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

_FORCED: bool | None = None


def deterministic_kernels(t: Tensor) -> bool:
    """Whether ops on ``t`` must take their backward from the deterministic formulations.

    True when ``torch.are_deterministic_algorithms_enabled()`` and ``t`` is not on the CPU (CUDA, meta, ...),
    unless :func:`force_deterministic_kernels` overrides it.
    """
    if _FORCED is not None:
        return _FORCED
    return t.device.type != 'cpu' and torch.are_deterministic_algorithms_enabled()


@contextlib.contextmanager
def force_deterministic_kernels(enabled: bool = True) -> Iterator[None]:
    """Force :func:`deterministic_kernels` to ``enabled`` on every device (tests: the formulations on the CPU,
    or the default kernels on the meta device in deterministic mode). Process-wide, not thread-local; keep the
    backward inside too (activation checkpointing recomputes the forward there)."""
    global _FORCED
    previous = _FORCED
    _FORCED = enabled
    try:
        yield
    finally:
        _FORCED = previous


def autocast_off(device: torch.device) -> contextlib.AbstractContextManager:
    """Autocast disabled on ``device``; nothing to disable on a device without autocast (meta)."""
    if torch.amp.is_autocast_available(device.type):
        return torch.autocast(device_type=device.type, enabled=False)
    return contextlib.nullcontext()


def _needs_formulation(x: Tensor, *others: Tensor) -> bool:
    """The switch is on and autograd will differentiate through the op (only backward kernels are at fault)."""
    return (deterministic_kernels(x) and torch.is_grad_enabled()
            and any(t.requires_grad for t in (x, *others)))


class _FormulationBackward(torch.autograd.Function):
    """The native kernel's forward with the backward of a formulation of the same op.

    Only the inputs are saved; backward recomputes ``formulation(*inputs)`` and differentiates it (one level:
    no double backward).
    """

    @staticmethod
    def forward(ctx, native: Callable[..., Tensor], formulation: Callable[..., Tensor], *inputs: Tensor) -> Tensor:
        ctx.formulation = formulation
        ctx.save_for_backward(*inputs)
        return native(*inputs)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out: Tensor):
        needs = ctx.needs_input_grad[2:]
        with torch.enable_grad():
            leaves = [t.detach().requires_grad_(need) for t, need in zip(ctx.saved_tensors, needs)]
            out = ctx.formulation(*leaves)
        wanted = [t for t, need in zip(leaves, needs) if need]
        grads = iter(torch.autograd.grad(out, wanted, grad_out, allow_unused=True))
        return (None, None, *(next(grads) if need else None for need in needs))


# ------------------------------------------------------------------------------------------------ sampling
def _unnormalise(coord: Tensor, size: int, align_corners: bool) -> Tensor:
    """grid_sample's map from [-1, 1] to pixel positions, rounded as its CPU kernel rounds them.

    Same bits as the CPU kernel, so both agree on which side of an integer a position lies (the bilinear weights
    have a kink there, and their gradient jumps). Without align_corners the kernel uses a fused multiply-add
    (one rounding), reproduced by computing the product and the shift in float64.
    """
    if align_corners:
        return (coord + 1) * ((size - 1) / 2)
    shifted = coord + 1
    return (shifted.to(torch.float64) * (size / 2) - 0.5).to(coord.dtype)


def grid_sample_backward(x: Tensor, grid: Tensor, grad_out: Tensor, mode: str = 'bilinear',
                         padding_mode: str = 'zeros', align_corners: bool = False, input_grad: bool = True,
                         grid_grad: bool = True) -> tuple[Tensor | None, Tensor | None]:
    """The gradients of ``F.grid_sample`` w.r.t. its input and grid, summed in a fixed order.

    Each sample reads up to four integer neighbours ('bilinear') or one ('nearest') with corner weights; a
    neighbour outside the image ('zeros') has weight zero, 'border' clamps the position into the image first.

    * input: the corner-weighted output gradients are added with ``index_add`` into a channels-last view of the
      input (deterministic on CUDA in deterministic mode and on the CPU, unlike grid_sample's atomic adds);
    * grid ('bilinear'): through the corner weights, e.g. ``d out / d px = wy0 (v[y0, x0 + 1] - v[y0, x0]) +
      wy1 (v[y0 + 1, x0 + 1] - v[y0 + 1, x0])`` with the corner values gathered by ``index_select``, dotted with
      the output gradient over the channels and scaled by ``d px / d grid``; zero where 'border' clamped the
      position (on the border too), as grid_sample. 'nearest' has no grid gradient (None).

    Args:
        x: (N, C, H, W).
        grid: (N, Ho, Wo, 2) normalised (x, y) positions.
        grad_out: (N, C, Ho, Wo).
        mode: 'bilinear' or 'nearest'.
        padding_mode: 'zeros' or 'border'.
        align_corners: as ``F.grid_sample``.
        input_grad, grid_grad: which gradients to compute.

    Returns:
        (grad_x (N, C, H, W) or None, grad_grid (N, Ho, Wo, 2) or None).
    """
    if mode not in ('bilinear', 'nearest') or padding_mode not in ('zeros', 'border'):
        raise ValueError(f'grid_sample_backward supports bilinear/nearest sampling with zeros/border padding, got '
                         f'{mode!r}/{padding_mode!r}')
    n, c, h, w = x.shape
    _, ho, wo, _ = grid.shape
    samples = n * ho * wo
    grid_grad = grid_grad and mode == 'bilinear'
    px = _unnormalise(grid[..., 0], w, align_corners)
    py = _unnormalise(grid[..., 1], h, align_corners)
    if padding_mode == 'border':
        free_x, free_y = (px > 0) & (px < w - 1), (py > 0) & (py < h - 1)
        px, py = px.clamp(0, w - 1), py.clamp(0, h - 1)
    if mode == 'nearest':
        xs, ys = px.round(), py.round()  # round half to even, as grid_sample
        corners = [((0, 0), torch.ones_like(px))]
    else:
        xs, ys = px.floor(), py.floor()
        wx1, wy1 = px - xs, py - ys
        wx0, wy0 = 1 - wx1, 1 - wy1
        corners = [((0, 0), wy0 * wx0), ((1, 0), wy0 * wx1), ((0, 1), wy1 * wx0), ((1, 1), wy1 * wx1)]
    # integer positions clamped just outside the image (no overflow; NaN counts as outside), then one flat index
    xs = xs.nan_to_num(-2.0).clamp(-2, w).long()
    ys = ys.nan_to_num(-2.0).clamp(-2, h).long()
    flat = ys * w + xs + torch.arange(n, device=x.device).view(n, 1, 1) * (h * w)
    g_rows = grad_out.permute(0, 2, 3, 1).reshape(samples, c)
    x_rows = x.permute(0, 2, 3, 1).reshape(n * h * w, c) if grid_grad else None
    grad_rows = x.new_zeros(n * h * w, c) if input_grad else None
    dots = []  # per corner: value . grad_out over the channels, zero outside the image
    for (dx, dy), weight in corners:
        inside = (xs >= -dx) & (xs < w - dx) & (ys >= -dy) & (ys < h - dy)
        # an outside neighbour reads the first pixel with weight zero
        index = torch.where(inside, flat + (dy * w + dx), 0).reshape(-1)
        if grad_rows is not None:
            grad_rows.index_add_(0, index, g_rows * torch.where(inside, weight, 0).reshape(samples, 1))
        if x_rows is not None:
            dot = (x_rows.index_select(0, index) * g_rows).sum(1).view(n, ho, wo)
            dots.append(torch.where(inside, dot, 0))
    grad_x = grad_rows.view(n, h, w, c).permute(0, 3, 1, 2) if grad_rows is not None else None
    if not grid_grad:
        return grad_x, None
    d00, d10, d01, d11 = dots  # (x0, y0), (x0 + 1, y0), (x0, y0 + 1), (x0 + 1, y0 + 1)
    grad_px = wy0 * (d10 - d00) + wy1 * (d11 - d01)
    grad_py = wx0 * (d01 - d00) + wx1 * (d11 - d10)
    if padding_mode == 'border':
        grad_px, grad_py = torch.where(free_x, grad_px, 0), torch.where(free_y, grad_py, 0)
    scale_x, scale_y = ((w - 1) / 2, (h - 1) / 2) if align_corners else (w / 2, h / 2)
    return grad_x, torch.stack((grad_px * scale_x, grad_py * scale_y), dim=-1)


class _GridSample(torch.autograd.Function):
    """``F.grid_sample`` forward (deterministic kernels) with :func:`grid_sample_backward` as backward."""

    @staticmethod
    def forward(ctx, x: Tensor, grid: Tensor, mode: str, padding_mode: str, align_corners: bool) -> Tensor:
        ctx.options = (mode, padding_mode, align_corners)
        ctx.save_for_backward(x, grid)
        return F.grid_sample(x, grid, mode=mode, padding_mode=padding_mode, align_corners=align_corners)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out: Tensor):
        x, grid = ctx.saved_tensors
        grad_x, grad_grid = grid_sample_backward(x, grid, grad_out, *ctx.options, input_grad=ctx.needs_input_grad[0],
                                                 grid_grad=ctx.needs_input_grad[1])
        return grad_x, grad_grid, None, None, None


def grid_sample(x: Tensor, grid: Tensor, mode: str = 'bilinear', padding_mode: str = 'zeros',
                align_corners: bool = False) -> Tensor:
    """``F.grid_sample``, with the deterministic :func:`grid_sample_backward` when :func:`deterministic_kernels`
    holds and autograd needs it.

    That covers modes 'bilinear' and 'nearest' with padding 'zeros' or 'border' (what VRT and RVRT use);
    'reflection' and 'bicubic' always run ``F.grid_sample`` entirely.

    Args:
        x: (N, C, H, W).
        grid: (N, Ho, Wo, 2) normalised (x, y) positions in [-1, 1].
        mode, padding_mode, align_corners: as ``F.grid_sample``.

    Returns:
        (N, C, Ho, Wo).
    """
    supported = mode in ('bilinear', 'nearest') and padding_mode in ('zeros', 'border')
    if not (supported and _needs_formulation(x, grid)):
        return F.grid_sample(x, grid, mode=mode, padding_mode=padding_mode, align_corners=align_corners)
    return _GridSample.apply(x, grid, mode, padding_mode, align_corners)


# ------------------------------------------------------------------------------------------------ warping
def _base_grid(h: int, w: int, device: torch.device, dtype: torch.dtype) -> Tensor:
    """Pixel coordinates ``(H, W, 2)``, last axis ordered (x, y)."""
    grid_y, grid_x = torch.meshgrid(
        torch.arange(h, dtype=dtype, device=device),
        torch.arange(w, dtype=dtype, device=device),
        indexing='ij',
    )
    return torch.stack((grid_x, grid_y), dim=2)


def _normalise(coord: Tensor, size: int) -> Tensor:
    """Map pixel coordinates to grid_sample's [-1, 1] (align_corners=True convention)."""
    return 2.0 * coord / max(size - 1, 1) - 1.0


def flow_warp(
    x: Tensor,
    flow: Tensor,
    interp_mode: str = 'bilinear',
    padding_mode: str = 'zeros',
    align_corners: bool = True,
) -> Tensor:
    """Warp an image or feature map with optical flow.

    Sampling runs in fp32 for every input dtype but float64 (sub-pixel coordinates do not survive bf16), and
    the result is cast back to ``x.dtype``. The sampling is :func:`grid_sample` (a deterministic backward under
    :func:`deterministic_kernels`).

    Args:
        x: (N, C, H, W) image or features.
        flow: (N, H, W, 2) flow in pixels, last axis (dx, dy).
        interp_mode: 'bilinear', 'nearest' or 'nearest4'. 'nearest4' samples the four integer neighbours
            (floor/ceil combinations, ordered x-floor/y-floor, x-floor/y-ceil, x-ceil/y-floor, x-ceil/y-ceil)
            and concatenates them along channels. 'nearest' and 'nearest4' pass no gradient to the flow.
        padding_mode: 'zeros', 'border' or 'reflection'.
        align_corners: passed to ``F.grid_sample``.

    Returns:
        (N, C, H, W), or (N, 4C, H, W) for 'nearest4'.
    """
    n, c, h, w = x.shape
    work = torch.float64 if torch.float64 in (x.dtype, flow.dtype) else torch.float32
    vgrid = _base_grid(h, w, x.device, work) + flow.to(work)
    src = x.to(work)
    if interp_mode == 'nearest4':
        gx, gy = vgrid[..., 0], vgrid[..., 1]
        x0, x1 = _normalise(torch.floor(gx), w), _normalise(torch.ceil(gx), w)
        y0, y1 = _normalise(torch.floor(gy), h), _normalise(torch.ceil(gy), h)
        # one sampling call: the four grids are stacked along the output height; floor/ceil have no gradient
        grid = torch.cat(
            [torch.stack(pair, dim=3) for pair in ((x0, y0), (x0, y1), (x1, y0), (x1, y1))], dim=1
        ).detach()  # (N, 4H, W, 2)
        out = grid_sample(src, grid, mode='nearest', padding_mode=padding_mode, align_corners=align_corners)
        out = out.view(n, c, 4, h, w).transpose(1, 2).reshape(n, 4 * c, h, w)
        return out.to(x.dtype)
    grid = torch.stack((_normalise(vgrid[..., 0], w), _normalise(vgrid[..., 1], h)), dim=3)
    if interp_mode == 'nearest':
        grid = grid.detach()
    out = grid_sample(src, grid, mode=interp_mode, padding_mode=padding_mode, align_corners=align_corners)
    return out.to(x.dtype)


# ------------------------------------------------------------------------------------------------ resizing
def _linear_taps(in_size: int, out_size: int, align_corners: bool, scale_factor: float | None,
                 device: torch.device, dtype: torch.dtype) -> tuple[Tensor, Tensor, Tensor]:
    """Source indices i0, i1 (out_size,) and the weight of i1, as PyTorch's upsample_bilinear2d maps them.

    With ``align_corners`` the source of output ``j`` is ``j * (in - 1) / (out - 1)`` (a given scale factor only
    sets the output size); otherwise ``max((j + 0.5) * s - 0.5, 0)`` with ``s = 1 / scale_factor`` when one is
    given, else ``in / out``.
    """
    dst = torch.arange(out_size, dtype=dtype, device=device)
    if align_corners:
        src = dst * ((in_size - 1) / (out_size - 1) if out_size > 1 else 0.0)
    else:
        scale = 1.0 / scale_factor if scale_factor else in_size / out_size
        src = ((dst + 0.5) * scale - 0.5).clamp_min(0)
    i0 = src.floor().clamp_max(in_size - 1)
    lam1 = (src - i0).clamp(0, 1)
    i1 = (i0 + 1).clamp_max(in_size - 1)
    return i0.long(), i1.long(), lam1


def _resize_axis(x: Tensor, dim: int, out_size: int, align_corners: bool, scale_factor: float | None) -> Tensor:
    """Linear resizing along one axis as two index_selects (deterministic backward) and a weighted sum."""
    i0, i1, lam1 = _linear_taps(x.shape[dim], out_size, align_corners, scale_factor, x.device, x.dtype)
    shape = [1] * x.dim()
    shape[dim] = out_size
    lam1 = lam1.view(shape)
    return x.index_select(dim, i0) * (1 - lam1) + x.index_select(dim, i1) * lam1


def resize_bilinear_formulation(x: Tensor, size: Sequence[int] | None = None, scale_factor: float | None = None,
                                align_corners: bool = False) -> Tensor:
    """``F.interpolate(x, size, scale_factor, mode='bilinear', align_corners)`` built from index_select taps,
    separable (width, then height), with a deterministic backward.

    Args:
        x: (N, C, H, W).
        size: (Ho, Wo), or None with ``scale_factor``.
        scale_factor: one factor for both axes (output size ``floor(size * factor)``), or None with ``size``.
        align_corners: as ``F.interpolate``.

    Returns:
        (N, C, Ho, Wo).
    """
    if (size is None) == (scale_factor is None):
        raise ValueError('resize_bilinear needs exactly one of size and scale_factor')
    h, w = x.shape[-2:]
    if size is None:
        out_h, out_w = math.floor(h * scale_factor), math.floor(w * scale_factor)
    else:
        out_h, out_w = size
    work = torch.promote_types(x.dtype, torch.float32)
    out = _resize_axis(x.to(work), 3, out_w, align_corners, scale_factor)
    out = _resize_axis(out, 2, out_h, align_corners, scale_factor)
    return out.to(x.dtype)


def resize_bilinear(x: Tensor, size: Sequence[int] | None = None, scale_factor: float | None = None,
                    align_corners: bool = False) -> Tensor:
    """``F.interpolate(x, size, scale_factor, mode='bilinear', align_corners)``; its backward comes from
    :func:`resize_bilinear_formulation` when :func:`deterministic_kernels` holds and autograd needs it.

    Args:
        x: (N, C, H, W).
        size: (Ho, Wo), or None with ``scale_factor``.
        scale_factor: one factor for both axes, or None with ``size``.
        align_corners: as ``F.interpolate``.

    Returns:
        (N, C, Ho, Wo).
    """
    options = {'size': size, 'scale_factor': scale_factor, 'align_corners': align_corners}
    if not _needs_formulation(x):
        return F.interpolate(x, mode='bilinear', **options)
    return _FormulationBackward.apply(functools.partial(F.interpolate, mode='bilinear', **options),
                                      functools.partial(resize_bilinear_formulation, **options), x)


# ------------------------------------------------------------------------------------------------ padding
def pad_formulation(x: Tensor, pads: Sequence[int], mode: str) -> Tensor:
    """'replicate' or 'reflect' ``F.pad`` as concatenations of slices (backward: slicing and summation).

    Args:
        x: (..., D1, ..., Dk) tensor.
        pads: non-negative (before, after) pairs starting from the last axis, as ``F.pad``.
        mode: 'replicate' or 'reflect'.

    Returns:
        The padded tensor.
    """
    if mode not in ('replicate', 'reflect'):
        raise ValueError(f"pad_formulation mode must be 'replicate' or 'reflect', got {mode!r}")
    for i in range(len(pads) // 2):
        dim = x.dim() - 1 - i
        before, after = pads[2 * i], pads[2 * i + 1]
        size = x.shape[dim]
        parts = []
        if mode == 'replicate':
            if before:
                parts.append(x.narrow(dim, 0, 1).expand(*x.shape[:dim], before, *x.shape[dim + 1:]))
            parts.append(x)
            if after:
                parts.append(x.narrow(dim, size - 1, 1).expand(*x.shape[:dim], after, *x.shape[dim + 1:]))
        else:
            if before >= size or after >= size:
                raise ValueError(f'reflect padding ({before}, {after}) must be below the size {size} of dim {dim}')
            if before:
                parts.append(x.narrow(dim, 1, before).flip(dim))
            parts.append(x)
            if after:
                parts.append(x.narrow(dim, size - 1 - after, after).flip(dim))
        x = torch.cat(parts, dim=dim)
    return x


def pad(x: Tensor, pads: Sequence[int], mode: str = 'constant', value: float | None = None) -> Tensor:
    """``F.pad``; for 'replicate' and 'reflect' its backward comes from :func:`pad_formulation` when
    :func:`deterministic_kernels` holds and autograd needs it.

    Args:
        x: (..., D1, ..., Dk) tensor.
        pads: (before, after) pairs starting from the last axis, as ``F.pad``.
        mode: 'constant', 'reflect', 'replicate' or 'circular'.
        value: fill value of 'constant'.

    Returns:
        The padded tensor.
    """
    pads = list(pads)
    if mode not in ('replicate', 'reflect') or min(pads) < 0 or not _needs_formulation(x):
        return F.pad(x, pads, mode=mode, value=value)
    return _FormulationBackward.apply(functools.partial(F.pad, pad=pads, mode=mode),
                                      functools.partial(pad_formulation, pads=pads, mode=mode), x)
