"""Frame sources: the frames of one test clip, read one at a time, with ``len()`` and ``frames(start)``.

:class:`FolderFrames` reads a clip folder, :class:`NoisyFrames` synthesises non-blind denoising input from GT frame
by frame; ``add_noise`` and ``sigma_map``
are the whole-clip forms they equal bit for bit. The test datasets hand them out as lazy items, and
:func:`models.video_stream.stream_video` consumes them.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from data.dataset_options import at_least
from utils.utils_option_schema import NUM, Opt
from utils.utils_video import DataCheckError, read_img_seq

__all__ = ["NOISE_OPTIONS", "FolderFrames", "NoisyFrames", "add_noise", "sigma_map"]

NOISE_OPTIONS: dict[str, Opt] = {
    "sigma": Opt(NUM, 0, "Non-blind denoising: the input is GT plus Gaussian noise of this std ([0, 255] scale), "
                 "unclipped, with the sigma map as channel 4 (0: the LQ frames are read).", refuse=at_least(0)),
    "noise_seed": Opt(int, 0, "Seed of that noise (a local generator; 0 gives the official test script's noise, "
                      "`torch.manual_seed(0)` before each clip)."),
}


def add_noise(gt: torch.Tensor, sigma: float, seed: int) -> torch.Tensor:
    """Non-blind denoising input: ``gt + N(0, sigma)`` (not clipped) with the sigma map appended.

    Args:
        gt: ``(T, 3, H, W)`` in [0, 1].
        sigma: noise std on the [0, 1] scale.
        seed: seed of the local generator (the global RNG is not used).

    Returns:
        ``(T, 4, H, W)``; channel 4 is ``sigma`` everywhere.
    """
    level = torch.full((1, 1, 1, 1), float(sigma))
    noise = torch.normal(mean=0.0, std=level.expand_as(gt), generator=torch.Generator().manual_seed(seed))
    t, _, h, w = gt.shape
    return torch.cat([gt + noise, level.expand(t, 1, h, w)], dim=1)


def sigma_map(lq: torch.Tensor, sigma: float) -> torch.Tensor:
    """Append a constant ``sigma`` channel to already-noisy ``(T, 3, H, W)`` frames -> ``(T, 4, H, W)``."""
    return torch.cat([lq, torch.full_like(lq[:, :1], float(sigma))], dim=1)


class FolderFrames:
    """The frames of one clip folder, read one file at a time (a frame source: ``len()`` and ``frames(start)``).

    Args:
        paths: the frame files, in order.
        name: the clip folder (for messages).
        cached: the decoded clip ``(T, 3, H, W)`` (``cache_data``), served instead of reading the files.
        sigma: when non-zero, append the constant noise-level map (non-blind denoising of already noisy frames).
    """

    def __init__(self, paths: Sequence[str], name: str, cached: torch.Tensor | None = None, sigma: float = 0.0) -> None:
        self.paths = list(paths)
        self.name = name
        self.cached = cached
        self.sigma = sigma

    def __len__(self) -> int:
        return len(self.paths)

    def frames(self, start: int = 0) -> Iterator[torch.Tensor]:
        """Frames ``start, start + 1, ...``: ``(3, H, W)`` (``(4, H, W)`` with ``sigma``) float32 RGB in [0, 1].

        Raises:
            DataCheckError: a file that cannot be read, or a frame whose size differs from the first one read
                (both named).
        """
        first: tuple[str, tuple[int, ...]] | None = None
        for index in range(start, len(self.paths)):
            path = self.paths[index]
            frame = self.cached[index] if self.cached is not None else read_img_seq([path])[0]
            if first is None:
                first = (path, tuple(frame.shape))
            elif tuple(frame.shape) != first[1]:
                raise DataCheckError(f"frame {path} is {frame.shape[-1]}x{frame.shape[-2]} but {first[0]} is "
                                     f"{first[1][-1]}x{first[1][-2]}: the frames of a clip must have one size")
            yield sigma_map(frame[None], self.sigma)[0] if self.sigma else frame


class NoisyFrames:
    """Non-blind denoising input synthesised from GT frame by frame: frame ``t`` equals ``add_noise(whole clip,
    sigma, seed)[t]`` bit for bit.

    ``add_noise`` draws the noise of the whole clip at once. PyTorch's CPU normal sampler fills a float32 tensor in
    blocks of 16 values (redrawing the last 16 when the size is not a multiple of 16), so drawing it in consecutive
    chunks whose sizes are multiples of 16 values, the remainder last, consumes the generator and gives the values
    exactly as one draw does (``tests/test_stream_eval.py`` checks this against ``add_noise``). Starting at a later
    frame draws and discards the noise of the frames before it (the GT of those frames is not read).

    Args:
        gt: the GT frames (a frame source).
        sigma: noise std on the [0, 1] scale.
        seed: seed of the local generator.
    """

    def __init__(self, gt: Any, sigma: float, seed: int) -> None:
        self.gt = gt
        self.sigma = sigma
        self.seed = seed
        self.name = gt.name

    def __len__(self) -> int:
        return len(self.gt)

    def frames(self, start: int = 0) -> Iterator[torch.Tensor]:
        """Frames ``start, start + 1, ...``: ``(4, H, W)``, the noisy RGB and the sigma map."""
        total = len(self.gt)
        if start >= total:
            return
        generator = torch.Generator().manual_seed(self.seed)
        level = torch.full((1, 1, 1, 1), float(self.sigma))
        frames = self.gt.frames(start)
        first = next(frames, None)
        if first is None:
            return
        chunk = self._chunk(first.numel())
        bounds = list(range(0, total, chunk)) + [total]
        if len(bounds) > 2 and (bounds[-1] - bounds[-2]) * first.numel() < 16:
            del bounds[-2]  # fewer than 16 values would take the sampler's scalar path: draw them with the chunk before
        pending = [first]
        for a, b in zip(bounds[:-1], bounds[1:]):
            noise = torch.normal(mean=0.0, std=level.expand(b - a, *first.shape), generator=generator)
            for t in range(max(a, start), b):
                frame = pending.pop() if pending else next(frames, None)
                if frame is None:  # the GT ended early: the consumer reports the short source
                    return
                yield torch.cat([frame + noise[t - a], level[0].expand(1, *frame.shape[1:])], dim=0)

    @staticmethod
    def _chunk(per_frame: int) -> int:
        """Frames per draw: the fewest whose values are a multiple of 16, and at least 16 of them."""
        chunk = 16 // math.gcd(16, per_frame)
        while chunk * per_frame < 16:
            chunk *= 2
        return chunk
