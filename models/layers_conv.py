"""Frame convolutions and the sub-pixel upsampler shared by VRT and RVRT.

The reference networks hold their per-frame convolutions as ``nn.Conv3d`` with a (1, k, k) kernel (so the
released checkpoints store 5-D weights); here they run as one 2-D convolution over all frames at once.
"""

from __future__ import annotations

import math

import torch.nn.functional as F
from torch import Tensor, nn


class FrameConv(nn.Conv3d):
    """A Conv3d with kernel (1, 3, 3) (reference parameter shape) run as a 2-D convolution on all frames.

    Input and output are frame-batched: (B * D, C, H, W).
    """

    def __init__(self, in_channels: int, out_channels: int) -> None:
        super().__init__(in_channels, out_channels, kernel_size=(1, 3, 3), padding=(0, 1, 1))

    def forward(self, x: Tensor) -> Tensor:
        """x: (B * D, C_in, H, W) -> (B * D, C_out, H, W)."""
        return F.conv2d(x, self.weight.squeeze(2), self.bias, padding=1)


def frame_conv(x: Tensor, conv: nn.Conv3d) -> Tensor:
    """Apply a Conv3d whose temporal kernel size is 1 to every frame, as one 2-D convolution.

    Args:
        x: (B * T, C_in, H, W) frame-batched input.
        conv: Conv3d with kernel (1, kh, kw) (the reference's parameter layout).

    Returns:
        (B * T, C_out, H', W').
    """
    return F.conv2d(x, conv.weight.squeeze(2), conv.bias, stride=conv.stride[1:], padding=conv.padding[1:],
                    groups=conv.groups)


class Upsample(nn.Module):
    """Sub-pixel upsampler on frame-batched features, ``scale`` in {2^n, 3}.

    Convolutions are registered under the indices of the reference's ``nn.Sequential`` (0, 5, 10, ... with
    the final 64 -> 64 convolution last), so checkpoints load unchanged.

    Args:
        scale: upscaling factor.
        num_feat: channels in and out.
    """

    def __init__(self, scale: int, num_feat: int) -> None:
        super().__init__()
        if scale & (scale - 1) == 0:
            steps = [2] * int(math.log2(scale))
        elif scale == 3:
            steps = [3]
        else:
            raise ValueError(f'Upsample scale {scale} is not supported; use a power of 2 or 3')
        self.factors = tuple(steps)
        for i, f in enumerate(steps):
            self.add_module(str(5 * i), FrameConv(num_feat, f * f * num_feat))
        self.add_module(str(5 * len(steps)), FrameConv(num_feat, num_feat))

    def forward(self, x: Tensor) -> Tensor:
        """x: (B * D, C, H, W) -> (B * D, C, sH, sW)."""
        for i, f in enumerate(self.factors):
            # in place: the shuffled activation is the head's largest (64 channels at the output resolution), and
            # neither pixel_shuffle's backward nor leaky_relu's (from its output, slope > 0) needs it kept
            x = F.leaky_relu_(F.pixel_shuffle(self.get_submodule(str(5 * i))(x), f), 0.1)
        return self.get_submodule(str(5 * len(self.factors)))(x)
