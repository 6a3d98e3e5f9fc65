"""3-D windows of the window attention (VRT's TMSA, RVRT's and IART's Swin blocks): partition and reverse, the
shifted partition as one cached gather, the shift masks (dense, or compact: only the windows on the shift border)
and their cache (an LRU bounded in bytes per device), the relative-position index and the sine position encoding.

Features are channels-last ``(B, D, H, W, C)``; a window holds ``wd * wh * ww`` tokens.
"""

from __future__ import annotations

import dataclasses
import math
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

Size3 = tuple[int, int, int]


def window_partition(x: Tensor, window_size: Size3) -> Tensor:
    """Split into non-overlapping windows.

    Args:
        x: (B, D, H, W, C), each of D, H, W divisible by the window.
        window_size: (Wd, Wh, Ww).

    Returns:
        (B * num_windows, Wd * Wh * Ww, C), windows ordered d-major, then h, then w.
    """
    b, d, h, w, c = x.shape
    wd, wh, ww = window_size
    x = x.view(b, d // wd, wd, h // wh, wh, w // ww, ww, c)
    return x.permute(0, 1, 3, 5, 2, 4, 6, 7).reshape(-1, wd * wh * ww, c)


def window_reverse(windows: Tensor, window_size: Size3, b: int, d: int, h: int, w: int) -> Tensor:
    """Inverse of :func:`window_partition`: (B * num_windows, Wd * Wh * Ww, C) -> (B, D, H, W, C)."""
    wd, wh, ww = window_size
    x = windows.view(b, d // wd, h // wh, w // ww, wd, wh, ww, -1)
    return x.permute(0, 1, 4, 2, 5, 3, 6, 7).reshape(b, d, h, w, -1)


def get_window_size(x_size: Size3, window_size: Size3, shift_size: Size3) -> tuple[Size3, Size3]:
    """Shrink the window (and zero the shift) along axes where the input is not larger than the window."""
    use_window = list(window_size)
    use_shift = list(shift_size)
    for i, n in enumerate(x_size):
        if n <= window_size[i]:
            use_window[i] = n
            use_shift[i] = 0
    return tuple(use_window), tuple(use_shift)  # type: ignore[return-value]


def _build_mask(d: int, h: int, w: int, window_size: Size3, shift_size: Size3, device: torch.device) -> Tensor:
    """The shift mask of :func:`compute_mask`, uncached."""
    mask_windows = _region_ids(d, h, w, window_size, shift_size, device)  # (nW, N)
    across = mask_windows.unsqueeze(1) != mask_windows.unsqueeze(2)  # (nW, N, N) bool: 1 byte per entry
    return torch.zeros(across.shape, device=device).masked_fill_(across, -100.0)


# Shift masks kept per device, least recently used dropped first. A mask is (num_windows, N, N) float32: the 001
# recipe's validation tiles (40 x 128 x 128 LQ) need 0.3-1.1 GB each at full scale, about 2 GB in all, which an
# unbounded cache keeps on the GPU for the rest of the run; the training sizes need tens of MB. A mask above the
# budget is built per call (a few memory-bound passes, negligible next to the attention that uses it).
MASK_CACHE_BYTES = 256 * 2**20


def _nbytes(entry: Tensor | ShiftMask) -> int:
    return entry.nbytes if isinstance(entry, ShiftMask) else entry.numel() * entry.element_size()


class _MaskCache:
    """LRU of shift masks, bounded by :data:`MASK_CACHE_BYTES` per device (read at every insertion)."""

    def __init__(self) -> None:
        self._entries: OrderedDict[tuple, Tensor] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: tuple, device: torch.device, build: Callable[[], Any]) -> Any:
        with self._lock:
            if key in self._entries:
                self._entries.move_to_end(key)
                return self._entries[key]
        # built outside inference mode: a mask first made during validation serves training steps after it
        with torch.inference_mode(False):
            mask = build()
        size = _nbytes(mask)
        with self._lock:
            if size > MASK_CACHE_BYTES:
                return mask
            while self.nbytes(device) + size > MASK_CACHE_BYTES:
                oldest = next(k for k in self._entries if k[-1] == device)
                del self._entries[oldest]
            self._entries[key] = mask
        return mask

    def nbytes(self, device: torch.device) -> int:
        """Bytes held for ``device``."""
        return sum(_nbytes(m) for k, m in self._entries.items() if k[-1] == device)

    def keys(self) -> list[tuple]:
        return list(self._entries)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()


MASK_CACHE = _MaskCache()


@torch.compiler.disable  # the cache is Python state: under torch.compile the mask comes in as a graph input
def compute_mask(d: int, h: int, w: int, window_size: Size3, shift_size: Size3, device: torch.device) -> Tensor:
    """Additive attention mask for shifted windows (0 inside a region, -100 across regions), cached per size.

    Args:
        d, h, w: padded input size, multiples of the window.
        window_size, shift_size: (Wd, Wh, Ww) window and its cyclic shift.
        device: where the mask lives (one cache budget per device).

    Returns:
        (num_windows, N, N) float32 with N = Wd * Wh * Ww; shared with later calls (do not modify it).
    """
    device = torch.device(device)
    key = (d, h, w, tuple(window_size), tuple(shift_size), device)
    return MASK_CACHE.get(key, device, lambda: _build_mask(d, h, w, window_size, shift_size, device))


@dataclass(frozen=True)
class ShiftMask:
    """The shift mask of :func:`compute_mask` kept compact: only the windows on the last slab along a shifted axis
    straddle the cyclic border (their tokens come from different regions); every other window's mask is all zeros.

    The masked windows have at most seven distinct masks, one per set of shifted axes whose border they lie on
    (a window's regions depend on nothing else). Window attention takes this in place of the dense
    ``(num_windows, N, N)`` mask: the zero-mask windows attend with the relative-position bias alone (broadcast
    over them), the windows of each distinct mask with the bias plus that mask (broadcast over them too). The
    result equals the dense mask's bit for bit, without the ``num_windows x heads x N x N`` bias that the dense
    mask needs (about 1 GB per shifted block of a 16-frame 180 x 320 clip with the demo's VRT).

    Attributes:
        num_windows: windows per sample (the dense mask's first axis).
        masked: (M,) int64 indices of the windows whose mask is not all zeros, those with the same mask together
            (runs of ``counts``), in index order within a run.
        unmasked: (num_windows - M,) int64 indices of the others, in index order.
        masks: (M, N, N) float32, 0 inside a region and -100 across regions (the dense mask's rows ``masked``).
        counts: windows per distinct mask: the runs of ``masked`` (and ``masks``) that share one mask.
        grouped: the windows it goes with come in groups (:func:`grouped_window_partition`): every sample's
            unmasked windows first, then every sample's windows of each run (sample-major within a group), so that
            the groups are slices; False: the windows come in :func:`window_partition` order, sample after sample.
    """

    num_windows: int
    masked: Tensor
    unmasked: Tensor
    masks: Tensor
    counts: tuple[int, ...]
    grouped: bool = False

    def in_groups(self) -> ShiftMask:
        """This mask for windows in the grouped order of :func:`grouped_window_partition` (the same tensors)."""
        return dataclasses.replace(self, grouped=True)

    def groups(self) -> list[tuple[Tensor, Tensor | None]]:
        """(window indices, their common (N, N) mask or None for all zeros) of each group: the unmasked windows,
        then each run of windows with one mask."""
        out: list[tuple[Tensor, Tensor | None]] = [(self.unmasked, None)]
        start = 0
        for count in self.counts:
            out.append((self.masked[start:start + count], self.masks[start]))
            start += count
        return out

    def dense(self) -> Tensor:
        """The dense ``(num_windows, N, N)`` mask of :func:`compute_mask`."""
        n = self.masks.shape[-1]
        full = self.masks.new_zeros(self.num_windows, n, n)
        return full.index_copy_(0, self.masked, self.masks)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.masked, self.unmasked, self.masks))


def _region_ids(d: int, h: int, w: int, window_size: Size3, shift_size: Size3, device: torch.device) -> Tensor:
    """Region id of every token of every window: (num_windows, N) float32 (the shifted-window partition's regions)."""
    img_mask = torch.zeros((1, d, h, w, 1), device=device)
    cnt = 0
    slices = [
        (slice(-ws), slice(-ws, -ss), slice(-ss, None)) for ws, ss in zip(window_size, shift_size)
    ]
    for sd in slices[0]:
        for sh in slices[1]:
            for sw in slices[2]:
                img_mask[:, sd, sh, sw, :] = cnt
                cnt += 1
    return window_partition(img_mask, window_size).squeeze(-1)  # (nW, N)


def _build_shift_mask(d: int, h: int, w: int, window_size: Size3, shift_size: Size3,
                      device: torch.device) -> ShiftMask:
    # a window straddles the border exactly when it is the last along an axis with a shift (the regions of every
    # other window are the first slice along every axis), and its regions depend only on which such axes it is last
    # along (``border``, one bit per axis); found from the sizes, so that it runs on the meta device
    grid = [n // ws for n, ws in zip((d, h, w), window_size)]
    border = torch.zeros(grid, dtype=torch.long)
    for axis, shift in enumerate(shift_size):
        if shift:
            border.select(axis, grid[axis] - 1).add_(1 << axis)
    border = border.flatten()
    masked = border.nonzero().flatten()
    masked = masked[torch.sort(border[masked], stable=True).indices]  # one run per border set, in index order
    counts = tuple(torch.unique_consecutive(border[masked], return_counts=True)[1].tolist())
    masked = masked.to(device)
    unmasked = (border == 0).nonzero().flatten().to(device)
    ids = _region_ids(d, h, w, window_size, shift_size, device)
    sel = ids.index_select(0, masked)
    across = sel.unsqueeze(1) != sel.unsqueeze(2)
    masks = torch.zeros(across.shape, device=device).masked_fill_(across, -100.0)
    return ShiftMask(ids.shape[0], masked, unmasked, masks, counts)


@torch.compiler.disable  # the cache is Python state: under torch.compile the mask comes in as a graph input
def compute_shift_mask(d: int, h: int, w: int, window_size: Size3, shift_size: Size3,
                       device: torch.device) -> ShiftMask:
    """The shift mask of :func:`compute_mask` as a :class:`ShiftMask` (cached per size, in the same cache).

    Args:
        d, h, w: padded input size, multiples of the window.
        window_size, shift_size: (Wd, Wh, Ww) window and its cyclic shift.
        device: where the mask lives.

    Returns:
        The compact mask (shared with later calls: do not modify it).
    """
    device = torch.device(device)
    key = ('windows', d, h, w, tuple(window_size), tuple(shift_size), device)
    return MASK_CACHE.get(key, device, lambda: _build_shift_mask(d, h, w, window_size, shift_size, device))


class _Gather(torch.autograd.Function):
    """``x.index_select(1, order)`` for a permutation ``order`` whose backward is the gather by ``inverse``: exact,
    one pass each way (the backward of ``index_select`` itself zero-fills and scatter-adds)."""

    @staticmethod
    def forward(ctx, x: Tensor, order: Tensor, inverse: Tensor) -> Tensor:
        ctx.save_for_backward(inverse)
        return x.index_select(1, order)

    @staticmethod
    def backward(ctx, grad: Tensor):
        (inverse,) = ctx.saved_tensors
        return grad.index_select(1, inverse), None, None


def _build_window_order(d: int, h: int, w: int, window_size: Size3, shift_size: Size3,
                        device: torch.device) -> Tensor:
    ids = torch.arange(d * h * w, device=device).view(1, d, h, w, 1)
    order = window_partition(torch.roll(ids, shifts=tuple(-s for s in shift_size), dims=(1, 2, 3)),
                             window_size).flatten()
    inverse = torch.empty_like(order).index_copy_(0, order, torch.arange(order.numel(), device=device))
    return torch.stack((order, inverse))


@torch.compiler.disable  # the cache is Python state
def window_order(d: int, h: int, w: int, window_size: Size3, shift_size: Size3, device: torch.device) -> Tensor:
    """Where each token of the shifted-window partition comes from (cached per size, in the mask cache).

    Returns:
        (2, D * H * W) int64: row 0 is the flat (d, h, w) position of each windowed token, windows in
        :func:`window_partition` order after ``torch.roll`` by ``-shift_size``; row 1 is its inverse permutation.
    """
    device = torch.device(device)
    key = ('order', d, h, w, tuple(window_size), tuple(shift_size), device)
    return MASK_CACHE.get(key, device, lambda: _build_window_order(d, h, w, window_size, shift_size, device))


def shifted_window_partition(x: Tensor, window_size: Size3, shift_size: Size3) -> Tensor:
    """``window_partition(torch.roll(x, -shift_size))`` as one gather (roll copies once per shifted axis).

    x: (B, D, H, W, C) -> (B * num_windows, Wd * Wh * Ww, C), the same values."""
    b, d, h, w, c = x.shape
    order = window_order(d, h, w, window_size, shift_size, x.device)
    n = window_size[0] * window_size[1] * window_size[2]
    return _Gather.apply(x.reshape(b, d * h * w, c), order[0], order[1]).view(-1, n, c)


def shifted_window_reverse(windows: Tensor, window_size: Size3, shift_size: Size3, b: int, d: int, h: int,
                           w: int) -> Tensor:
    """Inverse of :func:`shifted_window_partition`: (B * num_windows, N, C) -> (B, D, H, W, C)."""
    order = window_order(d, h, w, window_size, shift_size, windows.device)
    return _Gather.apply(windows.reshape(b, d * h * w, -1), order[1], order[0]).view(b, d, h, w, -1)


def _build_grouped_order(b: int, d: int, h: int, w: int, window_size: Size3, shift_size: Size3,
                         device: torch.device) -> Tensor:
    mask = compute_shift_mask(d, h, w, window_size, shift_size, device)
    per_window = window_order(d, h, w, window_size, shift_size, device)[0].view(mask.num_windows, -1)
    offsets = torch.arange(b, device=device).view(b, 1, 1) * (d * h * w)
    order = torch.cat([(per_window.index_select(0, group) + offsets).flatten() for group, _ in mask.groups()])
    inverse = torch.empty_like(order).index_copy_(0, order, torch.arange(order.numel(), device=device))
    return torch.stack((order, inverse))


@torch.compiler.disable  # the cache is Python state
def grouped_window_order(b: int, d: int, h: int, w: int, window_size: Size3, shift_size: Size3,
                         device: torch.device) -> Tensor:
    """:func:`window_order` over a batch of ``b`` samples with the windows in :class:`ShiftMask`'s groups (cached).

    Returns:
        (2, B * D * H * W) int64: row 0 is the flat (b, d, h, w) position of each windowed token, windows ordered
        by :meth:`ShiftMask.groups`, sample-major within a group; row 1 is its inverse.
    """
    device = torch.device(device)
    key = ('grouped', b, d, h, w, tuple(window_size), tuple(shift_size), device)
    return MASK_CACHE.get(key, device, lambda: _build_grouped_order(b, d, h, w, window_size, shift_size, device))


def grouped_window_partition(x: Tensor, window_size: Size3, shift_size: Size3) -> Tensor:
    """:func:`shifted_window_partition` with the windows grouped for :meth:`ShiftMask.in_groups`: one gather.

    x: (B, D, H, W, C) -> (B * num_windows, Wd * Wh * Ww, C): every sample's windows whose shift mask is all zeros,
    then every sample's windows of each distinct mask (:meth:`ShiftMask.groups`; the same windows as
    :func:`shifted_window_partition`, in another order)."""
    b, d, h, w, c = x.shape
    order = grouped_window_order(b, d, h, w, window_size, shift_size, x.device)
    n = window_size[0] * window_size[1] * window_size[2]
    return _Gather.apply(x.reshape(1, b * d * h * w, c), order[0], order[1]).view(-1, n, c)


def grouped_window_reverse(windows: Tensor, window_size: Size3, shift_size: Size3, b: int, d: int, h: int,
                           w: int) -> Tensor:
    """Inverse of :func:`grouped_window_partition`: (B * num_windows, N, C) -> (B, D, H, W, C)."""
    order = grouped_window_order(b, d, h, w, window_size, shift_size, windows.device)
    return _Gather.apply(windows.reshape(1, b * d * h * w, -1), order[1], order[0]).view(b, d, h, w, -1)


def relative_position_index(window_size: Size3) -> Tensor:
    """Pair-wise relative position index into the (2Wd-1)(2Wh-1)(2Ww-1) bias table: (N, N) int64."""
    coords = torch.stack(torch.meshgrid(*[torch.arange(n) for n in window_size], indexing='ij')).flatten(1)
    rel = (coords[:, :, None] - coords[:, None, :]).permute(1, 2, 0)  # (N, N, 3)
    rel = rel + torch.tensor([n - 1 for n in window_size])
    strides = torch.tensor([(2 * window_size[1] - 1) * (2 * window_size[2] - 1), 2 * window_size[2] - 1, 1])
    return (rel * strides).sum(-1)


def sine_position_encoding(hw: tuple[int, int], num_pos_feats: int, temperature: float = 10000.0) -> Tensor:
    """Normalised 2-D sine position encoding (DETR style) over an (H, W) grid.

    Returns:
        (1, H * W, 2 * num_pos_feats): y features then x features, each interleaving sin/cos.
    """
    scale, eps = 2 * math.pi, 1e-6
    ones = torch.ones(1, hw[0], hw[1])
    y_embed = ones.cumsum(1, dtype=torch.float32)
    x_embed = ones.cumsum(2, dtype=torch.float32)
    y_embed = y_embed / (y_embed[:, -1:, :] + eps) * scale
    x_embed = x_embed / (x_embed[:, :, -1:] + eps) * scale
    dim_t = torch.arange(num_pos_feats, dtype=torch.float32)
    dim_t = temperature ** (2 * (dim_t // 2) / num_pos_feats)
    pos_x = x_embed[:, :, :, None] / dim_t
    pos_y = y_embed[:, :, :, None] / dim_t
    pos_x = torch.stack((pos_x[:, :, :, 0::2].sin(), pos_x[:, :, :, 1::2].cos()), dim=4).flatten(3)
    pos_y = torch.stack((pos_y[:, :, :, 0::2].sin(), pos_y[:, :, :, 1::2].cos()), dim=4).flatten(3)
    return torch.cat((pos_y, pos_x), dim=3).flatten(1, 2).contiguous()
