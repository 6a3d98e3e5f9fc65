"""Checkpoint files: atomic writes, safe loads, finding the newest complete step, name-matched loading.

Layout in ``experiments/<task>/models/`` (KAIR-compatible): ``{step}_G.pth`` = ``{'params': state_dict}``,
``{step}_E.pth`` = ``{'params_ema': ...}`` (EMA on), ``{step}_optimizerG.pth``, and ``{step}_state.pth``
(scheduler, scaler, RNG, step, epoch, sampler position), written last: a step is complete only when its state
file exists. Every file is written to a temporary name and ``os.replace``d, so a crash mid-save never leaves a
truncated file under a final name and never touches an older complete step.
"""

from __future__ import annotations

import glob
import logging
import os
import pickle
import random
import re
from typing import Any

import numpy as np
import torch
from torch import nn

from utils import utils_dist, utils_fs, utils_safetensors
from utils.utils_fs import fsync_dir  # noqa: F401 (public here before utils_fs existed)

logger = logging.getLogger(__name__)

WRAPPER_PREFIXES = ("module.", "_orig_mod.")
_STEP_RE = re.compile(r"^(\d+)_state\.pth$")


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be used, reported as one line."""


def atomic_save(obj: Any, path: str) -> None:
    """``torch.save`` to ``path`` through a temporary file in the same folder, fsynced, ``os.replace``d, and the
    folder fsynced, so that once this returns the file survives a crash or a power loss under its final name.

    The temporary is ``<name>.tmp<pid>-<hex>`` (not hidden), the form :func:`remove_stale_temporaries` clears."""
    with utils_fs.atomic_open(path, "wb", durable=True, hidden=False) as f:
        torch.save(obj, f)


def safe_load(path: str, map_location: str | torch.device = "cpu") -> Any:
    """``torch.load(path, weights_only=True)`` with one-line errors.

    Raises:
        CheckpointError: missing or truncated file, or a file carrying pickled Python objects (refused without
            running them).
    """
    if not os.path.isfile(path):
        raise CheckpointError(f"checkpoint not found: {path}")
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CheckpointError(f"refused to load {path}: it is not a plain tensor checkpoint (weights_only load "
                              f"failed: {first}); only state dicts of tensors and plain data are accepted") from exc
    except (RuntimeError, EOFError, OSError) as exc:
        raise CheckpointError(f"cannot read checkpoint {path}: {str(exc).splitlines()[0]}") from exc


def complete_steps(models_dir: str) -> list[int]:
    """Steps in ``models_dir`` whose ``{step}_state.pth`` and ``{step}_G.pth`` both exist, ascending."""
    steps = []
    for path in glob.glob(os.path.join(glob.escape(models_dir), "*_state.pth")):
        match = _STEP_RE.match(os.path.basename(path))
        if match and os.path.isfile(os.path.join(models_dir, f"{match.group(1)}_G.pth")):
            steps.append(int(match.group(1)))
    return sorted(steps)


def latest_complete_step(models_dir: str) -> int:
    """The newest complete step in ``models_dir`` (0 when there is none)."""
    steps = complete_steps(models_dir)
    return steps[-1] if steps else 0


@utils_dist.master_only
def remove_stale_temporaries(models_dir: str) -> list[str]:
    """Delete ``*.pth.tmp<pid>`` files left by a process killed while saving (never a complete file)."""
    stale = glob.glob(os.path.join(glob.escape(models_dir), "*.pth.tmp*"))
    for path in stale:
        os.remove(path)
        logger.warning("removed %s, left by an interrupted save", path)
    return stale


def strip_prefixes(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Drop DDP's ``module.`` and ``torch.compile``'s ``_orig_mod.`` prefixes from every key."""
    out = {}
    for key, value in state_dict.items():
        changed = True
        while changed:
            changed = False
            for prefix in WRAPPER_PREFIXES:
                if key.startswith(prefix):
                    key, changed = key[len(prefix):], True
        out[key] = value
    return out


def extract_state_dict(obj: Any, param_key: str | None, path: str) -> dict[str, torch.Tensor]:
    """Return the state dict inside a loaded checkpoint (``{'params': ...}``, ``{'params_ema': ...}`` or bare)."""
    if isinstance(obj, dict) and param_key and param_key in obj and isinstance(obj[param_key], dict):
        obj = obj[param_key]
    elif isinstance(obj, dict):
        for key in ("params", "params_ema", "state_dict"):
            if key in obj and isinstance(obj[key], dict):
                obj = obj[key]
                break
    if not isinstance(obj, dict) or not all(isinstance(v, torch.Tensor) for v in obj.values()):
        raise CheckpointError(f"{path} holds no state dict of tensors (expected {{'{param_key}': state_dict}})")
    return strip_prefixes(obj)


def _summary(names: list[str], limit: int = 4) -> str:
    shown = ", ".join(names[:limit])
    return f"{len(names)} ({shown}{', ...' if len(names) > limit else ''})"


def load_network(net: nn.Module, path: str, param_key: str = "params", strict: bool = True) -> None:
    """Load weights by name into ``net`` (never by position).

    Args:
        net: the bare network.
        path: a ``.pth`` file: ``{'params': sd}``, ``{'params_ema': sd}`` or a bare state dict; or a
            ``.safetensors`` file holding one state dict (:mod:`utils.utils_safetensors`).
        param_key: the key to look under first.
        strict: every key must match in name and shape; otherwise missing, unexpected and shape-mismatched
            keys are skipped and summarised in the log.

    Raises:
        CheckpointError: strict loading of a checkpoint that does not match (with a short summary).
    """
    if utils_safetensors.is_safetensors(path):
        try:
            loaded = strip_prefixes(utils_safetensors.read_state_dict(path))
        except (FileNotFoundError, ValueError) as exc:
            raise CheckpointError(str(exc)) from exc
    else:
        loaded = extract_state_dict(safe_load(path), param_key, path)
    adapt = getattr(net, "adapt_state_dict", None)  # a network may translate foreign layouts (released files) by name
    if callable(adapt):
        loaded = adapt(loaded)
    own = net.state_dict()
    missing = [k for k in own if k not in loaded]
    unexpected = [k for k in loaded if k not in own]
    mismatched = [k for k in own if k in loaded and own[k].shape != loaded[k].shape]
    problems = []
    if missing:
        problems.append(f"missing {_summary(missing)}")
    if unexpected:
        problems.append(f"unexpected {_summary(unexpected)}")
    if mismatched:
        shapes = [f"{k} {tuple(loaded[k].shape)} vs {tuple(own[k].shape)}" for k in mismatched]
        problems.append(f"shape-mismatched {_summary(shapes, 2)}")
    if problems and strict:
        raise CheckpointError(f"{path} does not fit the network ({type(net).__name__}): {'; '.join(problems)}. "
                              "Is it another architecture or scale? Set train.G_param_strict=false to load the "
                              "matching tensors only")
    if problems:
        logger.warning("non-strict load of %s: %s", path, "; ".join(problems))
    usable = {k: v for k, v in loaded.items() if k in own and k not in mismatched}
    net.load_state_dict(usable, strict=False)


def _numpy_state_to_plain(state: tuple) -> dict[str, Any]:
    name, keys, pos, has_gauss, cached = state
    return {"name": name, "keys": torch.from_numpy(np.asarray(keys, dtype=np.int64)), "pos": int(pos),
            "has_gauss": int(has_gauss), "cached": float(cached)}


def _plain_to_numpy_state(plain: dict[str, Any]) -> tuple:
    keys = plain["keys"].numpy().astype(np.uint32)
    return (plain["name"], keys, plain["pos"], plain["has_gauss"], plain["cached"])


def capture_rng_state() -> dict[str, Any]:
    """RNG states of torch (CPU and CUDA), Python and NumPy, as data that loads with ``weights_only=True``."""
    py_version, py_state, py_gauss = random.getstate()
    state = {
        "torch": torch.get_rng_state(),
        "python": {"version": py_version, "state": torch.tensor(py_state, dtype=torch.int64), "gauss": py_gauss},
        "numpy": _numpy_state_to_plain(np.random.get_state()),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: dict[str, Any]) -> None:
    """Inverse of :func:`capture_rng_state`."""
    torch.set_rng_state(state["torch"])
    py = state["python"]
    random.setstate((py["version"], tuple(int(v) for v in py["state"].tolist()), py["gauss"]))
    np.random.set_state(_plain_to_numpy_state(state["numpy"]))
    if "cuda" in state and torch.cuda.is_available():
        cuda_states = state["cuda"]
        if len(cuda_states) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(cuda_states)
