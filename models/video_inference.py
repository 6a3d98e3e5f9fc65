"""Tiled video inference with the rules of the official VRT/RVRT test scripts.

A video is restored in temporal clips (``num_frame_testing`` frames, consecutive clips overlapping by
``num_frame_overlapping``; overlapping output frames are averaged), and every clip in spatial patches
(``size_patch_testing`` LQ pixels, overlapping by ``overlap_size``). For spatial patches, ``overlap_size // 2``
*output* pixels are dropped at every interior patch edge and the rest is weight-normalised, as in the official
script. A clip or frame that is not tiled is mirror-padded only up to the next window multiple,
``(ws - d % ws) % ws`` (nothing when it already fits), then cropped back.

:func:`infer_video` takes the whole (already decoded) video and accumulates the output in float32 on the CPU, so
device memory is bounded by one tile whatever the video length (on a GPU each temporal clip goes there in one copy,
its patches are blended there, and its output comes back in one copy). :func:`models.video_stream.stream_video`
applies the same rules to frames read one at a time and returns each output frame as soon as it is final,
bit-identical.

Differences from the official script, all where it would crash or be wrong:

- a spatial patch that is smaller than ``size_patch_testing`` (a frame smaller than the tile) is padded with
  the same mirror rule instead of going into the network unpadded;
- frame interpolation (``vfi``) always runs on the whole clip (no temporal tiling or padding: the network maps
  exactly its D input frames to one frame).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

from models.net_io import NetIO

logger = logging.getLogger(__name__)

__all__ = ["blend_weights", "check_tiling_args", "infer_video", "pad_to_window", "tile_starts"]


def tile_starts(length: int, tile: int, overlap: int) -> list[int]:
    """Start indices of the tiles along one axis (the official rule).

    ``range(0, length - tile, tile - overlap)`` plus a last tile flush with the end; a single tile at 0 when
    ``length <= tile``.

    Args:
        length: size of the axis.
        tile: tile size (> overlap).
        overlap: overlap between consecutive tiles.
    """
    if tile <= overlap:
        raise ValueError(f"tile size {tile} must be larger than its overlap {overlap}")
    return list(range(0, length - tile, tile - overlap)) + [max(0, length - tile)]


def blend_weights(length: int, tile: int, overlap: int, scale: int = 1) -> list[tuple[int, Tensor]]:
    """Un-normalised 1-D blending masks of the spatial patches along one axis, at output resolution.

    Each patch gets ones, except ``overlap // 2`` output pixels at each of its interior edges (an edge that is
    not the border of the image), which get zero. The 2-D mask of a patch is the outer product of its row and
    column masks; the output is ``sum(mask * patch) / sum(mask)``.

    Args:
        length: LQ size of the axis.
        tile: LQ patch size.
        overlap: LQ overlap between consecutive patches.
        scale: upscaling factor of the network.

    Returns:
        ``[(output_start, mask)]`` with ``mask`` of shape ``(min(tile, length) * scale,)``.
    """
    starts = tile_starts(length, tile, overlap)
    size = min(tile, length) * scale
    trim = overlap // 2
    masks = []
    for i, start in enumerate(starts):
        mask = torch.ones(size)
        if i < len(starts) - 1:
            mask[size - trim:] = 0
        if i > 0:
            mask[:trim] = 0
        masks.append((start * scale, mask))
    return masks


def pad_to_window(x: Tensor, dim: int, window: int) -> tuple[Tensor, int]:
    """Mirror-pad ``x`` along ``dim`` up to the next multiple of ``window`` (the official test-script rule).

    The ``(window - n % window) % window`` extra entries are the last ones, reversed (nothing is added when the
    size already fits; when the pad exceeds the size, only ``n`` entries are added, as in the reference).

    Returns:
        The padded tensor and the original size along ``dim``.
    """
    n = x.shape[dim]
    pad = (window - n % window) % window
    if pad == 0:
        return x, n
    tail = x.narrow(dim, max(0, n - pad), min(pad, n)).flip(dim)
    return torch.cat([x, tail], dim=dim), n


def io_tiling(io: NetIO) -> dict[str, Any]:
    """The keyword arguments of :func:`infer_video` that the network's :class:`~models.net_io.NetIO` decides."""
    return {"scale": io.scale, "window_size": io.input_multiple, "in_chans": io.in_chans,
            "vfi": io.frame_interpolation, "clip_frames": io.clip_frames}


def check_tiling_args(shape: Sequence[int], *, window_size: Sequence[int], size_patch_testing: int,
                      in_chans: int | None, vfi: bool, pad_seq: bool, clip_frames: int = 0) -> None:
    """Reject settings :func:`infer_video` cannot honour; ``shape`` is the input's ``(B, D, C, h, w)``.

    Args:
        in_chans: the channels the network reads (``NetIO.in_chans``); ``None``: not checked.
        clip_frames: the frames every forward reads (``NetIO.clip_frames``, frame interpolation); 0: any.

    Raises:
        ValueError: a message naming the setting and what would work.
    """
    if len(shape) != 5:
        raise ValueError(f"lq must be (B, D, C, h, w), got shape {tuple(shape)}")
    if len(window_size) != 3:
        raise ValueError(f"window_size must be (T, H, W), got {window_size}")
    if size_patch_testing % window_size[-1]:
        raise ValueError(f"size_patch_testing={size_patch_testing} must be a multiple of the window size "
                         f"{window_size[-1]}")
    if in_chans is not None and shape[2] != in_chans:
        raise ValueError(f"the network reads {in_chans} input channels, the input has {shape[2]}")
    if vfi and pad_seq:
        raise ValueError("pad_seq is meaningless for frame interpolation (the network needs exactly its D frames)")
    if vfi and clip_frames and shape[1] != clip_frames:
        raise ValueError(f"frame interpolation: the network reads exactly {clip_frames} input frames per forward, "
                         f"the clip has {shape[1]}")


class _Runner:
    """Runs the network on one tile: moves it to the device, applies autocast, returns float32 (on the CPU, or
    left on the device with ``keep_on_device``)."""

    def __init__(self, net: Callable[[Tensor], Tensor], device: torch.device, autocast_dtype: torch.dtype | None,
                 window_size: Sequence[int], keep_on_device: bool = False) -> None:
        self.net = net
        self.device = device
        self.autocast_dtype = autocast_dtype
        self.window_size = tuple(int(v) for v in window_size)
        self.keep_on_device = keep_on_device
        self._masks: dict[tuple[int, ...], list[tuple[int, int, Tensor]]] = {}

    def __call__(self, x: Tensor) -> Tensor:
        x = x.to(self.device, non_blocking=True)
        ctx = (torch.autocast(device_type=self.device.type, dtype=self.autocast_dtype)
               if self.autocast_dtype is not None else contextlib.nullcontext())
        with ctx:
            out = self.net(x)
        return out.float() if self.keep_on_device else out.float().cpu()

    def masks(self, h: int, w: int, size_patch: int, overlap: int, scale: int) -> list[tuple[int, int, Tensor]]:
        """``[(h0, w0, mask)]``: output origin and 2-D blend mask of every spatial patch of an ``h`` x ``w`` frame,
        where the patch outputs land; built once per frame size (a copy to the device would wait for it)."""
        key = (h, w, size_patch, overlap, scale)
        if key not in self._masks:
            where = self.device if self.keep_on_device else torch.device("cpu")
            self._masks[key] = [(h0, w0, (mask_h[:, None] * mask_w[None, :]).to(where))
                                for h0, mask_h in blend_weights(h, size_patch, overlap, scale)
                                for w0, mask_w in blend_weights(w, size_patch, overlap, scale)]
        return self._masks[key]

    def padded(self, x: Tensor, scale: int) -> Tensor:
        """Spatially mirror-pad ``x`` (B, D, C, h, w) to window multiples, run, crop to ``h*scale, w*scale``."""
        x, h = pad_to_window(x, 3, self.window_size[1])
        x, w = pad_to_window(x, 4, self.window_size[2])
        return self(x)[..., : h * scale, : w * scale]


def _infer_clip(run: _Runner, lq: Tensor, scale: int, size_patch: int, overlap: int) -> Tensor:
    """One clip, whole or in spatial patches. ``lq``: (B, D, C, h, w); returns (B, D', 3, h*scale, w*scale) where
    the runner leaves its outputs (the patches are blended there)."""
    if run.keep_on_device and lq.device.type == "cpu":  # one copy per clip; the patches are cut on the device
        lq = lq.pin_memory().to(run.device, non_blocking=True) if run.device.type == "cuda" else lq.to(run.device)
    if not size_patch:
        return run.padded(lq, scale)
    h, w = lq.shape[-2:]
    out = weight = None
    for h0, w0, mask in run.masks(h, w, size_patch, overlap, scale):
        hs, ws = h0 // scale, w0 // scale
        patch = run.padded(lq[..., hs: hs + size_patch, ws: ws + size_patch], scale)
        if out is None:
            out = torch.zeros(*patch.shape[:3], h * scale, w * scale, device=patch.device)
            weight = torch.zeros(h * scale, w * scale, device=patch.device)
        region = (..., slice(h0, h0 + mask.shape[0]), slice(w0, w0 + mask.shape[1]))
        out[region].add_(patch * mask)
        weight[region].add_(mask)
    assert out is not None and weight is not None
    return out.div_(weight)


def _infer_frames(run: _Runner, lq: Tensor, scale: int, nft: int, nfo: int, size_patch: int,
                  overlap: int, vfi: bool) -> Tensor:
    """The whole (already pad/flip-extended) sequence, in temporal clips or at once."""
    d = lq.shape[1]
    if vfi:
        return _infer_clip(run, lq, scale, size_patch, overlap).cpu()
    if not nft:
        lq, d = pad_to_window(lq, 1, run.window_size[0])
        return _infer_clip(run, lq, scale, size_patch, overlap)[:, :d].cpu()
    out = count = None
    for d0 in tile_starts(d, nft, nfo):
        clip = _infer_clip(run, lq[:, d0: d0 + nft], scale, size_patch, overlap).cpu()
        if out is None:
            out = torch.zeros(clip.shape[0], d, *clip.shape[2:])
            count = torch.zeros(1, d, 1, 1, 1)
        out[:, d0: d0 + clip.shape[1]].add_(clip)
        count[:, d0: d0 + clip.shape[1]].add_(1)
    assert out is not None and count is not None
    return out.div_(count)


def infer_video(net: Callable[[Tensor], Tensor], lq: Tensor, *, scale: int, window_size: Sequence[int],
                num_frame_testing: int = 0, num_frame_overlapping: int = 2, size_patch_testing: int = 0,
                overlap_size: int = 20, in_chans: int | None = None, vfi: bool = False, clip_frames: int = 0,
                pad_seq: bool = False, flip_seq: bool = False, center_frame_only: bool = False,
                device: torch.device | None = None, autocast_dtype: torch.dtype | None = None) -> Tensor:
    """Restore a whole video with temporal/spatial tiling.

    Runs under ``torch.no_grad`` (the caller may add ``torch.inference_mode``; without it the result is an
    ordinary tensor that can be modified in place).

    Args:
        net: the network, ``(b, d, C, h', w') -> (b, d, 3, h'*scale, w'*scale)`` (VFI: ``(b, 1, 3, h', w')``),
            already in eval mode and on ``device``.
        lq: ``(B, D, C, h, w)`` in [0, 1] on any device; C = ``in_chans`` (a non-blind denoiser's noise-level map
            last).
        scale: upscaling factor of the network.
        window_size: the network's ``(T, H, W)`` attention window; padding goes to multiples of it.
        num_frame_testing: frames per temporal clip, 0 = the whole video at once (mirror-padded to a multiple
            of ``window_size[0]``). Ignored for VFI.
        num_frame_overlapping: frames shared by consecutive clips (their outputs are averaged).
        size_patch_testing: LQ patch size (a multiple of ``window_size[-1]``), 0 = whole frames (mirror-padded
            to window multiples).
        overlap_size: LQ overlap between spatial patches (``overlap_size // 2`` output pixels trimmed).
        in_chans: the channels the network reads (``NetIO.in_chans``; with a noise-level map the output has one
            fewer); ``None``: not checked.
        vfi: frame interpolation: the D input frames give one output frame, whole clip.
        clip_frames: the frames every forward reads (``NetIO.clip_frames``); a VFI clip of another length is
            refused. 0: any.
        pad_seq: append a copy of the last frame before inference and drop its output (KAIR ``val.pad_seq``).
        flip_seq: also restore the time-reversed sequence and average both (KAIR ``val.flip_seq``; for VFI
            the reversed input's interpolated frame is averaged with the forward one).
        center_frame_only: keep only output frame ``D // 2``.
        device: where tiles run; default ``lq.device``.
        autocast_dtype: ``torch.bfloat16``/``torch.float16`` for autocast on ``device``, ``None`` for fp32.

    Returns:
        ``(B, D', 3, h*scale, w*scale)`` float32 on the CPU, with D' = D (1 for VFI or ``center_frame_only``).
    """
    check_tiling_args(lq.shape, window_size=window_size, size_patch_testing=size_patch_testing, in_chans=in_chans,
                      vfi=vfi, pad_seq=pad_seq, clip_frames=clip_frames)
    device = device if device is not None else lq.device
    # on a GPU, a clip's patches are blended there and its output copied back once (not once per patch)
    run = _Runner(net, device, autocast_dtype, window_size, keep_on_device=device.type == "cuda")
    nft = 0 if vfi else int(num_frame_testing)
    args = (scale, nft, int(num_frame_overlapping), int(size_patch_testing), int(overlap_size), vfi)
    with torch.no_grad():
        n = lq.shape[1]
        if pad_seq:
            lq = torch.cat([lq, lq[:, -1:]], dim=1)
        if flip_seq and vfi:
            out = 0.5 * (_infer_frames(run, lq, *args) + _infer_frames(run, lq.flip(1), *args))
        elif flip_seq:
            out = _infer_frames(run, torch.cat([lq, lq.flip(1)], dim=1), *args)
            half = out.shape[1] // 2
            out = 0.5 * (out[:, :half] + out[:, half:].flip(1))
        else:
            out = _infer_frames(run, lq, *args)
        if pad_seq:
            out = out[:, :n]
        if center_frame_only and not vfi:
            out = out[:, n // 2: n // 2 + 1]
    return out
