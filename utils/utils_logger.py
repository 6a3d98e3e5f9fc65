"""Logging set-up (rank-aware, KAIR's line format) and the TensorBoard writer."""

from __future__ import annotations

import logging
import logging.handlers
import os
import sys
from typing import Any

import numpy as np
import torch

from utils import utils_dist

KAIR_FORMAT = "%(asctime)s.%(msecs)03d : %(message)s"
KAIR_DATEFMT = "%y-%m-%d %H:%M:%S"
FILE_ONLY = {"file_only": True}  # ``logger.info(..., extra=FILE_ONLY)``: train.log only, not the console


def _not_file_only(record: logging.LogRecord) -> bool:
    return not getattr(record, "file_only", False)


def setup_logger(log_file: str | None, rank: int, level: int = logging.INFO) -> logging.Logger:
    """Configure the root logger once, from ``main``.

    Rank 0 logs INFO to the console and (append mode) to ``log_file`` in KAIR's format, so existing parsing
    scripts keep working; records logged with ``extra=FILE_ONLY`` (the full options block) go to the file only.
    Other ranks log WARNING and above to the console with a ``[rank N]`` prefix. Called
    first without a file (records are kept in memory), then again with the file once the run is known to
    start: the kept records go to the file first.

    Args:
        log_file: ``experiments/<task>/train.log`` (rank 0 only; ``None`` for console only).
        rank: global rank of this process.
        level: level for rank 0.

    Returns:
        The root logger.
    """
    root = logging.getLogger()
    buffered: list[logging.LogRecord] = []
    for handler in list(root.handlers):
        if isinstance(handler, logging.handlers.MemoryHandler):
            buffered.extend(handler.buffer)
            handler.buffer = []
        root.removeHandler(handler)
        handler.close()
    fmt = KAIR_FORMAT if rank == 0 else f"[rank {rank}] {KAIR_FORMAT}"
    formatter = logging.Formatter(fmt, datefmt=KAIR_DATEFMT)
    console = logging.StreamHandler(sys.stdout)
    console.setFormatter(formatter)
    console.addFilter(_not_file_only)
    root.addHandler(console)
    if rank == 0 and log_file:
        os.makedirs(os.path.dirname(log_file) or ".", exist_ok=True)
        file_handler = logging.FileHandler(log_file, mode="a", encoding="utf-8")
        file_handler.setFormatter(formatter)
        root.addHandler(file_handler)
        for record in buffered:  # what was logged before the experiment folder could be written
            file_handler.handle(record)
    elif rank == 0:
        root.addHandler(logging.handlers.MemoryHandler(capacity=100000, flushLevel=logging.CRITICAL + 1))
    root.setLevel(level if rank == 0 else logging.WARNING)
    return root


class TensorBoardWriter:
    """A rank-0 TensorBoard writer; every method is a no-op elsewhere or when disabled."""

    def __init__(self, log_dir: str | None, enabled: bool = True) -> None:
        self._writer: Any = None
        if enabled and log_dir and utils_dist.get_rank() == 0:
            from torch.utils.tensorboard import SummaryWriter

            self._writer = SummaryWriter(log_dir=log_dir)

    def scalars(self, values: dict[str, float], step: int, prefix: str = "") -> None:
        """Log ``{name: value}`` at ``step``."""
        if self._writer is not None:
            for key, value in values.items():
                self._writer.add_scalar(f"{prefix}{key}", value, step)

    def image(self, tag: str, image: torch.Tensor | np.ndarray, step: int) -> None:
        """Log one image ``(3, H, W)`` float in [0, 1]."""
        if self._writer is not None:
            self._writer.add_image(tag, image, step, dataformats="CHW")

    def close(self) -> None:
        if self._writer is not None:
            self._writer.flush()
            self._writer.close()
            self._writer = None
