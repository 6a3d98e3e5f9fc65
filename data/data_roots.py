"""The data roots an option file names must exist before a run starts: a missing one is one line naming the key,
the path and the nearest existing folder, and synthetic data is written only where the option file asks for it
for that very path (``synthesize_if_missing.root``, the real-world demo's training videos and footage), never into a
misspelt folder."""

from __future__ import annotations

import difflib
import os
from collections.abc import Mapping
from typing import Any

ROOT_KEYS = ("dataroot_gt", "dataroot_lq")


def same_path(a: str | None, b: str | None) -> bool:
    """Whether two paths name the same place (relative ones from the working directory)."""
    return bool(a) and bool(b) and os.path.normpath(os.path.abspath(a)) == os.path.normpath(os.path.abspath(b))


def writes_synthetic(dataset_opt: Mapping[str, Any], key: str = "dataroot_gt") -> bool:
    """The data set may write synthetic videos into its ``key`` folder (``dataroot_gt`` of a training set,
    ``dataroot_lq`` of a footage set without GT): its ``synthesize_if_missing`` names that very folder as its
    ``root``."""
    spec = dataset_opt.get("synthesize_if_missing")
    return isinstance(spec, Mapping) and same_path(spec.get("root"), dataset_opt.get(key))


def nearest_existing(path: str) -> str:
    """The existing folder closest to a missing ``path``: a sibling with a similar name (``/tmp/videos`` for
    ``/tmp/vidoes``), else the deepest existing parent. Relative paths stay relative."""
    full = os.path.abspath(path)
    parent, missing = full, ""
    while not os.path.isdir(parent):
        parent, missing = os.path.dirname(parent), os.path.basename(parent)
    nearest = parent
    try:
        entries = [e for e in os.listdir(parent) if not e.startswith(".")]
    except OSError:
        entries = []
    close = difflib.get_close_matches(missing, entries, n=1, cutoff=0.6) if missing else []
    if close:
        nearest = os.path.join(parent, close[0])
    return nearest if os.path.isabs(path) else os.path.relpath(nearest)


def missing_data_root(datasets: Mapping[str, Mapping[str, Any]]) -> str | None:
    """The first data root of ``opt['datasets']`` that does not exist (and is not one the option file asks to be
    written), as one line naming the key, the path and the nearest existing folder; ``None`` when all exist."""
    for phase, dataset_opt in datasets.items():
        if not isinstance(dataset_opt, Mapping):
            continue
        for key in ROOT_KEYS:
            path = dataset_opt.get(key)
            if not isinstance(path, str) or not path or os.path.exists(path):
                continue
            if writes_synthetic(dataset_opt, key):
                continue
            return (f"datasets.{phase}.{key} = {path} does not exist (nearest existing folder: "
                    f"{nearest_existing(path)})")
    return None
