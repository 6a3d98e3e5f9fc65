"""What a network eats and gives, stated once by the network and read by every entry point.

Training, validation, ``main_test_vrt.py``, tiled and streamed inference, the memory planner and the exporter
all read a network's :class:`NetIO` (through :func:`net_io`) instead of testing ``net_type`` or one network's
flags. A network class states it as an ``io`` property built from its constructor arguments.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from torch import nn

__all__ = ["InputMismatch", "NetIO", "net_io", "unwrap"]


class InputMismatch(ValueError):
    """The data does not have the channels the network reads (the message names both numbers)."""


@dataclass(frozen=True)
class NetIO:
    """A network's input and output, frame by frame (``(N, D, C, h, w)`` in, ``(N, D', out_chans, h*scale,
    w*scale)`` out, values in [0, 1]).

    Attributes:
        in_chans: channels of each input frame: the image channels, plus one when ``noise_map``.
        out_chans: channels of each output frame.
        scale: spatial upscaling factor (1 for deblurring, denoising and frame interpolation).
        noise_map: the last input channel is the noise-level map (sigma / 255, constant over the frame) of a
            non-blind denoiser.
        frame_interpolation: the network outputs the frames between its input frames.
        input_multiple: ``(frames, height, width)`` multiples test-time padding rounds a clip up to.
        temporal_tile: recommended frames per temporal tile at test time (0: the whole clip).
        temporal_overlap: recommended frames shared by consecutive temporal tiles.
        clip_frames: input frames of every forward when the network takes a fixed number (VRT's frame
            interpolation: its ``img_size[0]``); 0: any number.
        min_size: smallest height and width of an input frame (of a tile at test time) the network takes (IART: 64,
            as its official implementation asserts); 0: no minimum beyond what the padding multiple gives.
    """

    in_chans: int = 3
    out_chans: int = 3
    scale: int = 1
    noise_map: bool = False
    frame_interpolation: bool = False
    input_multiple: tuple[int, int, int] = (1, 1, 1)
    temporal_tile: int = 0
    temporal_overlap: int = 2
    clip_frames: int = 0
    min_size: int = 0

    @property
    def image_chans(self) -> int:
        """Channels of the image part of an input frame (``in_chans`` less the noise-level map)."""
        return self.in_chans - int(self.noise_map)

    def describe_input(self) -> str:
        """``'4 (RGB + noise-level map)'``-style words for messages."""
        image = "RGB" if self.image_chans == 3 else f"{self.image_chans} image channels"
        return f"{self.in_chans} ({image} + noise-level map)" if self.noise_map else f"{self.in_chans} ({image})"

    def check_channels(self, channels: int, where: str) -> None:
        """Refuse data whose frames carry ``channels`` channels when the network reads ``in_chans``.

        Args:
            channels: channels of the data's input frames.
            where: the data's name for the message (a file, an option key, a flag).

        Raises:
            InputMismatch: one line naming both numbers and what would fix it.
        """
        if channels == self.in_chans:
            return
        if self.noise_map and channels == self.image_chans:
            fix = "give a noise level (--sigma or datasets.*.sigma) so the noise-level map is added"
        elif channels == self.in_chans + 1:
            fix = ("this network reads no noise-level map: give it data without one (no --sigma or sigma), or use a "
                   "non-blind denoiser")
        else:
            fix = "use data or a network with matching channels"
        raise InputMismatch(f"{where} gives {channels} input channels but the network reads "
                            f"{self.describe_input()}; {fix}")

    def temporal_tiling(self, tile: int | None, overlap: int | None) -> tuple[int, int]:
        """Frames per temporal tile and frames shared by consecutive tiles: the given values, else the network's
        recommendation (``temporal_tile``/``temporal_overlap``).

        A recommended overlap is cut to ``tile - 1`` when a given tile is not longer than it (a tile of 6 frames
        cannot share 10 with its neighbour); a given overlap is used as it is (and refused if it does not fit).

        Args:
            tile: frames per tile (0: the whole clip), ``None`` for the network's.
            overlap: frames shared by neighbouring tiles, ``None`` for the network's.
        """
        tile = self.temporal_tile if tile is None else int(tile)
        if overlap is not None:
            return tile, int(overlap)
        return tile, min(self.temporal_overlap, tile - 1) if tile else self.temporal_overlap

    def as_metadata(self) -> dict[str, str]:
        """Every field as a string, keyed by its name (exported files carry it; :meth:`from_metadata` reads it back):
        integers in decimal, booleans as ``0``/``1``, tuples comma-separated.

        Raises:
            TypeError: a field of another type (give it a form here and in :meth:`from_metadata`).
        """
        return {f.name: _to_text(f.name, getattr(self, f.name)) for f in fields(self)}

    @classmethod
    def from_metadata(cls, meta: Mapping[str, str]) -> NetIO:
        """The :class:`NetIO` that :meth:`as_metadata` wrote; a field the metadata lacks (a file written before the
        field existed) takes its default."""
        values = {f.name: _from_text(f.name, meta[f.name], f.default) for f in fields(cls) if f.name in meta}
        return cls(**values)


def _to_text(name: str, value: Any) -> str:
    if isinstance(value, bool):
        return str(int(value))
    if isinstance(value, int):
        return str(value)
    if isinstance(value, tuple) and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        return ",".join(map(str, value))
    raise TypeError(f"NetIO.{name}: no metadata form for {type(value).__name__} {value!r}")


def _from_text(name: str, text: str, default: Any) -> Any:
    if isinstance(default, bool):
        return text == "1"
    if isinstance(default, int):
        return int(text)
    if isinstance(default, tuple):
        return tuple(int(v) for v in text.split(","))
    raise TypeError(f"NetIO.{name}: no metadata form for {type(default).__name__}")


def unwrap(net: nn.Module) -> nn.Module:
    """The bare network inside DDP (``.module``) and ``torch.compile`` (``._orig_mod``) wrappers."""
    while True:
        inner = getattr(net, "module", None) or getattr(net, "_orig_mod", None)
        if not isinstance(inner, nn.Module):
            return net
        net = inner


def net_io(net: nn.Module) -> NetIO:
    """The :class:`NetIO` of a network (wrappers looked through).

    Raises:
        TypeError: the network states none (every registered network must have an ``io`` property).
    """
    bare = unwrap(net)
    io = getattr(bare, "io", None)
    if not isinstance(io, NetIO):
        raise TypeError(f"{type(bare).__name__} does not state its input and output: give it an 'io' property "
                        "returning models.net_io.NetIO")
    return io
