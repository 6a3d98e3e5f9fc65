"""Pixel losses for video restoration: Charbonnier, L1, L2, L2-sum and SSIM (as 1 - SSIM, 5-D aware)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class CharbonnierLoss(nn.Module):
    """``mean(sqrt((x - y)^2 + eps))`` with ``eps`` inside the square root, as in the reference.

    Args:
        eps: added to the squared difference (not squared itself); KAIR's recipes use 1e-9.
    """

    def __init__(self, eps: float = 1e-9) -> None:
        super().__init__()
        self.eps = eps

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.sqrt((x - y).pow(2) + self.eps).mean()


def _gaussian_window(size: int = 11, sigma: float = 1.5) -> torch.Tensor:
    coords = torch.arange(size, dtype=torch.float64) - size // 2
    g = torch.exp(-(coords**2) / (2 * sigma**2))
    g = g / g.sum()
    return (g[:, None] @ g[None, :]).float()


class SSIMLoss(nn.Module):
    """``1 - SSIM`` with an 11x11 Gaussian window (sigma 1.5), C1 = 0.01^2, C2 = 0.03^2, inputs in [0, 1].

    Accepts images ``(B, C, H, W)`` or videos ``(B, T, C, H, W)`` (frames are folded into the batch).
    """

    def __init__(self, window_size: int = 11, sigma: float = 1.5) -> None:
        super().__init__()
        self.register_buffer("window", _gaussian_window(window_size, sigma)[None, None], persistent=False)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        if x.dim() == 5:
            x, y = x.flatten(0, 1), y.flatten(0, 1)
        channels = x.shape[1]
        window = self.window.to(dtype=x.dtype).expand(channels, 1, -1, -1)
        pad = window.shape[-1] // 2

        def blur(t: torch.Tensor) -> torch.Tensor:
            return F.conv2d(t, window, padding=pad, groups=channels)

        c1, c2 = 0.01**2, 0.03**2
        mu_x, mu_y = blur(x), blur(y)
        var_x = blur(x * x) - mu_x.pow(2)
        var_y = blur(y * y) - mu_y.pow(2)
        cov = blur(x * y) - mu_x * mu_y
        ssim = ((2 * mu_x * mu_y + c1) * (2 * cov + c2)) / ((mu_x.pow(2) + mu_y.pow(2) + c1) * (var_x + var_y + c2))
        return 1.0 - ssim.mean()


LOSSES = {
    "l1": lambda train_opt: nn.L1Loss(),
    "l2": lambda train_opt: nn.MSELoss(),
    "l2sum": lambda train_opt: nn.MSELoss(reduction="sum"),
    "ssim": lambda train_opt: SSIMLoss(),
    "charbonnier": lambda train_opt: CharbonnierLoss(train_opt["G_charbonnier_eps"]),
}


def define_loss(train_opt: dict) -> nn.Module:
    """Build the pixel loss named by ``train.G_lossfn_type``."""
    name = train_opt["G_lossfn_type"]
    if name not in LOSSES:
        raise KeyError(f"train.G_lossfn_type={name!r} is unknown; valid: {sorted(LOSSES)}")
    return LOSSES[name](train_opt)
