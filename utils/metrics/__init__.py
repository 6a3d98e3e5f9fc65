"""Image and video quality metrics: the registry (:mod:`utils.metrics.registry`), the streaming per-clip scorer
(:mod:`utils.metrics.scorer`), the weight files (:mod:`utils.metrics.weights`) and one module per metric family.
See docs/metrics.md.

``from utils.metrics import resolve`` stays light (no torchvision, OpenCV or SciPy); the scorer, weights and VMAF
names are imported on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

from utils.metrics.registry import DEFAULT_METRICS, METRICS, MetricError, MetricSpec, check_clip_length, resolve

_LAZY = {
    "ClipScorer": "utils.metrics.scorer",
    "MetricSuite": "utils.metrics.scorer",
    "ensure_weights": "utils.metrics.weights",
    "DEFAULT_WEIGHTS_DIR": "utils.metrics.weights",
    "WEIGHTS": "utils.metrics.weights",
    "vmaf_clip": "utils.metrics.vmaf",
}

__all__ = ["DEFAULT_METRICS", "METRICS", "MetricError", "MetricSpec", "check_clip_length", "resolve", *_LAZY]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'utils.metrics' has no attribute {name!r}")
