"""Flow-based warping (bilinear, nearest and nearest-4 sampling), shared by SpyNet, VRT and RVRT."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def _base_grid(h: int, w: int, device: torch.device) -> Tensor:
    """Pixel coordinates ``(H, W, 2)`` in fp32, last axis ordered (x, y)."""
    grid_y, grid_x = torch.meshgrid(
        torch.arange(h, dtype=torch.float32, device=device),
        torch.arange(w, dtype=torch.float32, device=device),
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

    Sampling runs in fp32 whatever the input dtype (sub-pixel coordinates do not survive bf16), and the
    result is cast back to ``x.dtype``.

    Args:
        x: (N, C, H, W) image or features.
        flow: (N, H, W, 2) flow in pixels, last axis (dx, dy).
        interp_mode: 'bilinear', 'nearest' or 'nearest4'. 'nearest4' samples the four integer neighbours
            (floor/ceil combinations, ordered x-floor/y-floor, x-floor/y-ceil, x-ceil/y-floor, x-ceil/y-ceil)
            and concatenates them along channels; it passes no gradient to the flow.
        padding_mode: 'zeros', 'border' or 'reflection'.
        align_corners: passed to ``F.grid_sample``.

    Returns:
        (N, C, H, W), or (N, 4C, H, W) for 'nearest4'.
    """
    n, c, h, w = x.shape
    vgrid = _base_grid(h, w, x.device) + flow.float()
    src = x.float()
    if interp_mode == 'nearest4':
        gx, gy = vgrid[..., 0], vgrid[..., 1]
        x0, x1 = _normalise(torch.floor(gx), w), _normalise(torch.ceil(gx), w)
        y0, y1 = _normalise(torch.floor(gy), h), _normalise(torch.ceil(gy), h)
        # one grid_sample call: the four sampling grids are stacked along the output height
        grid = torch.cat(
            [torch.stack(pair, dim=3) for pair in ((x0, y0), (x0, y1), (x1, y0), (x1, y1))], dim=1
        )  # (N, 4H, W, 2)
        out = F.grid_sample(src, grid, mode='nearest', padding_mode=padding_mode, align_corners=align_corners)
        out = out.view(n, c, 4, h, w).transpose(1, 2).reshape(n, 4 * c, h, w)
        return out.to(x.dtype)
    grid = torch.stack((_normalise(vgrid[..., 0], w), _normalise(vgrid[..., 1], h)), dim=3)
    out = F.grid_sample(src, grid, mode=interp_mode, padding_mode=padding_mode, align_corners=align_corners)
    return out.to(x.dtype)
