"""A small convolutional video restoration baseline (for smoke tests and very fast experiments)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from timm.layers import DropPath
from torch import nn

from models.net_io import NetIO


class VideoConvBaseline(nn.Module):
    """Per-frame residual CNN with a temporal (3, 3, 3) convolution and pixel-shuffle upsampling.

    Args:
        upscale: spatial scale factor (1, 2 or 4).
        in_chans: input channels (4 for non-blind denoising: RGB + noise map).
        out_chans: output channels.
        num_feat: feature width.
        num_block: number of residual blocks.
        drop_path_rate: stochastic depth of the residual blocks (as VRT's, it draws from the global torch RNG in
            training, which is what makes resumed runs sensitive to the RNG stream).
        noise_map: the last input channel is a noise-level map (default: ``in_chans == out_chans + 1``).
    """

    input_multiple = (1, 1, 1)  # any clip size works: test-time padding adds nothing

    def __init__(self, upscale: int = 4, in_chans: int = 3, out_chans: int = 3, num_feat: int = 32,
                 num_block: int = 3, drop_path_rate: float = 0.0, noise_map: bool | None = None) -> None:
        super().__init__()
        self.in_chans = in_chans
        self.noise_map = noise_map
        self.upscale = upscale
        self.out_chans = out_chans
        self.conv_first = nn.Conv3d(in_chans, num_feat, (3, 3, 3), padding=1)
        self.body = nn.ModuleList(
            nn.Sequential(nn.Conv3d(num_feat, num_feat, (1, 3, 3), padding=(0, 1, 1)), nn.LeakyReLU(0.1, True),
                          nn.Conv3d(num_feat, num_feat, (1, 3, 3), padding=(0, 1, 1)))
            for _ in range(num_block))
        self.drop_path = DropPath(drop_path_rate) if drop_path_rate > 0 else nn.Identity()
        self.conv_up = nn.Conv2d(num_feat, out_chans * upscale * upscale, 3, padding=1)

    @property
    def io(self) -> NetIO:
        """What the baseline eats and gives (any clip length and size)."""
        noise = self.in_chans == self.out_chans + 1 if self.noise_map is None else self.noise_map
        return NetIO(in_chans=self.in_chans, out_chans=self.out_chans, scale=self.upscale, noise_map=noise,
                     input_multiple=self.input_multiple, temporal_tile=0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Restore a clip.

        Args:
            x: ``(N, D, C, h, w)`` in [0, 1].

        Returns:
            ``(N, D, out_chans, h * upscale, w * upscale)``.
        """
        n, d, _, h, w = x.shape
        feat = F.leaky_relu(self.conv_first(x.transpose(1, 2)), 0.1)
        for block in self.body:
            feat = feat + self.drop_path(block(feat))
        feat = feat.transpose(1, 2).reshape(n * d, -1, h, w)
        out = F.pixel_shuffle(self.conv_up(feat), self.upscale)
        base = x[:, :, : self.out_chans].reshape(n * d, self.out_chans, h, w)
        if self.upscale > 1:
            base = F.interpolate(base, scale_factor=self.upscale, mode="bilinear", align_corners=False)
        return (out + base).reshape(n, d, self.out_chans, h * self.upscale, w * self.upscale)
