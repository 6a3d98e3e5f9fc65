"""An exported network (``scripts/export.py``) run by ONNX Runtime, in place of the PyTorch network.

:class:`OnnxNetwork` is called as the network is, ``(N, D, C, h, w) -> (N, D', C_out, h*scale, w*scale)`` float32,
so tiled and streamed inference (:mod:`models.video_inference`, :mod:`models.video_stream`), sharding and metrics
are the PyTorch path's. What the graph eats is read back from the file's metadata (:func:`io_from_metadata`), and a
tile the graph was not built for is refused with one line (:class:`TileMismatch`), never run into a silent wrong
result: the number of frames is fixed at export, and the height and width too unless the exporter found the graph
free of size-dependent Python branches (then any multiple of ``hw_multiple`` runs).

onnxruntime is an optional dependency, imported when a file is opened.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor, nn

from models.net_io import NetIO

logger = logging.getLogger(__name__)

__all__ = ["MISSING_ORT", "ExportedTile", "OnnxNetwork", "TileMismatch", "default_providers", "io_from_metadata",
           "tile_from_metadata"]

MISSING_ORT = ("onnxruntime is not installed: pip install onnxruntime (or onnxruntime-gpu for the CUDA/TensorRT "
               "providers), or the project's extra: pip install onnx onnxscript onnxruntime")

# Providers in order of preference; the CPU provider is always available.
PREFERRED_PROVIDERS = ("TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider")


class TileMismatch(ValueError):
    """A tile the exported graph was not built for (the message names both shapes and the fix)."""


@dataclass(frozen=True)
class ExportedTile:
    """The tile an exported graph runs on.

    Attributes:
        frames: frames per tile (fixed in the graph).
        height, width: the tile's input size at export.
        dynamic_hw: other heights and widths run too (multiples of ``hw_multiple``).
        hw_multiple: ``(height, width)`` multiples a dynamic graph accepts.
    """

    frames: int
    height: int
    width: int
    dynamic_hw: bool
    hw_multiple: tuple[int, int]

    def as_metadata(self) -> dict[str, str]:
        """``tile``, ``dynamic_hw`` and ``hw_multiple`` as strings (:func:`tile_from_metadata` reads them back)."""
        return {"tile": f"{self.frames},{self.height},{self.width}", "dynamic_hw": str(int(self.dynamic_hw)),
                "hw_multiple": ",".join(map(str, self.hw_multiple))}

    def check(self, shape: Sequence[int], path: str, in_chans: int) -> None:
        """Refuse an input ``(N, D, C, h, w)`` the graph cannot run.

        Raises:
            TileMismatch: one line naming the file, the shape and what would run.
        """
        if len(shape) != 5:
            raise TileMismatch(f"{path}: expects input (N, D, C, h, w), got shape {tuple(shape)}")
        _, d, c, h, w = (int(n) for n in shape)
        built = f"{path} was exported for tiles of {self.frames} x {self.height} x {self.width}"
        if c != in_chans:
            raise TileMismatch(f"{path} reads {in_chans} input channels, got {c}")
        if d != self.frames:
            raise TileMismatch(f"{built} (frames, height, width); this tile has {d} frames (a clip shorter than "
                               f"the tile, or another --tile). Run with --tile {self.frames} H W, or export again with "
                               f"--tile {d} {h} {w}")
        if self.dynamic_hw:
            mh, mw = self.hw_multiple
            if h % mh or w % mw:
                raise TileMismatch(f"{built}, height and width any multiples of {mh} x {mw}; this tile is {h} x {w}")
            return
        if (h, w) != (self.height, self.width):
            raise TileMismatch(f"{built} (frames, height, width) and its graph fixes height and width (the network "
                               f"has size-dependent branches); this tile is {h} x {w}. Use --tile {self.frames} "
                               f"{self.height} {self.width} on frames of at least {self.height} x {self.width}, or "
                               f"export again with --tile {d} {h} {w}")


def io_from_metadata(meta: dict[str, str]) -> NetIO:
    """The :class:`NetIO` an exporter wrote with ``NetIO.as_metadata()`` (:meth:`NetIO.from_metadata`)."""
    return NetIO.from_metadata(meta)


def tile_from_metadata(meta: dict[str, str]) -> ExportedTile:
    """The :class:`ExportedTile` an exporter wrote with :meth:`ExportedTile.as_metadata`."""
    frames, height, width = (int(v) for v in meta["tile"].split(","))
    mh, mw = (int(v) for v in meta["hw_multiple"].split(","))
    return ExportedTile(frames, height, width, meta["dynamic_hw"] == "1", (mh, mw))


def default_providers() -> list[str]:
    """TensorRT, CUDA and the CPU, those of them this onnxruntime build has."""
    import onnxruntime as ort

    available = set(ort.get_available_providers())
    return [p for p in PREFERRED_PROVIDERS if p in available]


class OnnxNetwork(nn.Module):
    """An exported network, run by an ONNX Runtime session on one tile at a time.

    Args:
        path: the ``.onnx`` file written by ``scripts/export.py``.
        providers: ONNX Runtime execution providers (default :func:`default_providers`).
        threads: intra-op threads of the session (default ``torch.get_num_threads()``, so that processes sharing
            a machine under torchrun divide it as the PyTorch path does).

    Raises:
        ImportError: onnxruntime is missing (:data:`MISSING_ORT`).
        FileNotFoundError: no such file.
        ValueError: the file lacks the exporter's metadata (not written by ``scripts/export.py``).
    """

    def __init__(self, path: str, providers: Sequence[str] | None = None, threads: int | None = None) -> None:
        super().__init__()
        try:
            import onnxruntime as ort
        except ImportError as exc:
            raise ImportError(MISSING_ORT) from exc
        if not os.path.isfile(path):
            raise FileNotFoundError(f"ONNX file not found: {path}")
        options = ort.SessionOptions()
        options.intra_op_num_threads = int(threads or torch.get_num_threads())
        options.inter_op_num_threads = 1
        options.log_severity_level = 3  # ORT's warnings about constant folding would fill the log
        self.path = path
        self.session = ort.InferenceSession(path, options, providers=list(providers or default_providers()))
        self.metadata: dict[str, str] = dict(self.session.get_modelmeta().custom_metadata_map)
        missing = [k for k in ("tile", "dynamic_hw", "hw_multiple", "in_chans", "scale") if k not in self.metadata]
        if missing:
            raise ValueError(f"{path} has no {', '.join(missing)} in its metadata: export it with scripts/export.py")
        self._io = io_from_metadata(self.metadata)
        self.tile = tile_from_metadata(self.metadata)
        graph_input = self.session.get_inputs()[0]
        self._input_name = graph_input.name
        self._input_dtype = np.float16 if graph_input.type == "tensor(float16)" else np.float32
        logger.info("ONNX Runtime runs %s (providers %s; tile %s)", path, ", ".join(self.session.get_providers()),
                    self.metadata["tile"])

    def check_clip_lengths(self, clips: Sequence[tuple[str, int]], tiling: dict) -> None:
        """Refuse, before any work, a clip shorter than the graph's frames (PyTorch would run it as one shorter tile).

        Args:
            clips: ``(name, frames)`` of each clip to restore.
            tiling: the evaluation's tiling (``num_frame_testing``, ``pad_seq``, ``flip_seq``, ``vfi``).

        Raises:
            TileMismatch: one line naming the first such clip, its length, the graph's frames and the fix.
        """
        if tiling.get("vfi") or not tiling.get("num_frame_testing"):
            return  # frame interpolation and whole-clip tiles: the per-tile check says it
        t = self.tile.frames
        for name, frames in clips:
            seen = (frames + int(bool(tiling.get("pad_seq")))) * (2 if tiling.get("flip_seq") else 1)
            if 0 < seen < t:
                raise TileMismatch(
                    f"clip {name} has {frames} frames ({seen} with its padding or flip), fewer than the {t} frames of "
                    f"every tile of {self.path} (an exported graph's frames are fixed; PyTorch runs such a clip as one "
                    f"{seen}-frame tile): export a graph for it with --tile {seen} {self.tile.height} "
                    f"{self.tile.width} and run the short clips with that file, or without --onnx")

    @property
    def io(self) -> NetIO:
        """What the exported network eats and gives (from the file's metadata)."""
        return self._io

    def forward(self, x: Tensor) -> Tensor:
        """Run the graph on each sample of ``x``.

        Args:
            x: ``(N, D, C, h, w)`` in [0, 1], any float dtype and device.

        Returns:
            ``(N, D', out_chans, h*scale, w*scale)`` float32 on ``x``'s device.

        Raises:
            TileMismatch: a shape the graph was not built for.
        """
        self.tile.check(x.shape, self.path, self._io.in_chans)
        batch = x.detach().float().cpu().numpy().astype(self._input_dtype, copy=False)
        outs = [self.session.run(None, {self._input_name: batch[i: i + 1]})[0] for i in range(batch.shape[0])]
        return torch.from_numpy(np.concatenate(outs).astype(np.float32, copy=False)).to(x.device)
