"""Weights as ``.safetensors``: one state dict of tensors plus string metadata, read without unpickling anything.

A ``.safetensors`` file written by ``scripts/export.py --format safetensors`` holds the bare state dict of one
network (G or its EMA) and, in its metadata, which one (``param_key``) and the options it was built from
(``netG`` as JSON). :func:`utils.utils_checkpoint.load_network` reads such a file wherever it reads a ``.pth``
(``--model_path``, ``path.pretrained_netG``), so the rest of the code never sees the difference.
"""

from __future__ import annotations

import json
import os
from typing import Any

import torch

from utils.utils_fs import atomic_path

__all__ = ["SUFFIX", "is_safetensors", "read_metadata", "read_state_dict", "write_state_dict"]

SUFFIX = ".safetensors"


def is_safetensors(path: str | os.PathLike) -> bool:
    """Whether ``path`` names a safetensors file (by its suffix, as the format has no magic number)."""
    return os.fspath(path).lower().endswith(SUFFIX)


def read_state_dict(path: str) -> dict[str, torch.Tensor]:
    """The tensors of a safetensors file, on the CPU.

    Raises:
        FileNotFoundError: no such file.
        ValueError: the file is not a readable safetensors file (one line naming it).
    """
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    if not os.path.isfile(path):
        raise FileNotFoundError(f"weights file not found: {path}")
    try:
        return load_file(path, device="cpu")
    except (SafetensorError, OSError) as exc:
        raise ValueError(f"cannot read {path} as safetensors: {str(exc).splitlines()[0]}") from exc


def read_metadata(path: str) -> dict[str, str]:
    """The string metadata of a safetensors file (empty when it has none)."""
    from safetensors import safe_open

    with safe_open(path, framework="pt", device="cpu") as f:
        return dict(f.metadata() or {})


def write_state_dict(state: dict[str, torch.Tensor], path: str, metadata: dict[str, Any] | None = None) -> None:
    """Write ``state`` (tensors made contiguous, shared storage copied apart) with ``metadata`` (values turned
    into strings: dicts and lists as JSON) through a temporary file and ``os.replace``
    (:func:`utils.utils_fs.atomic_path`)."""
    from safetensors.torch import save_file

    tensors = {k: v.detach().to("cpu").contiguous().clone() for k, v in state.items()}
    meta = {k: v if isinstance(v, str) else json.dumps(v) for k, v in (metadata or {}).items()}
    with atomic_path(path) as tmp:
        save_file(tensors, tmp, metadata=meta)
