"""Image and video quality metrics: the registry (:mod:`utils.metrics.registry`), the streaming per-clip scorer
(:mod:`utils.metrics.scorer`) and one module per metric family. See docs/metrics.md."""

from __future__ import annotations

from utils.metrics.registry import DEFAULT_METRICS, METRICS, MetricError, MetricSpec, check_clip_length, resolve

__all__ = ["DEFAULT_METRICS", "METRICS", "MetricError", "MetricSpec", "check_clip_length", "resolve"]
