"""Scoring restored clips, shared by validation during training and ``main_test_vrt.py``: the chosen metrics
(:mod:`utils.metrics`' registry decides what each one is), per-clip and over-clip means, output frame names and the
log lines.

KAIR's four (``psnr ssim psnr_y ssim_y``, the ``kair`` family) keep KAIR's lines byte for byte::

    Testing 000                  ( 0/4) - PSNR: 27.12 dB; SSIM: 0.7812; PSNR_Y: 28.43 dB; SSIM_Y: 0.8001
    Average PSNR: 27.12 dB; SSIM: 0.7812; PSNR_Y: 28.43 dB; SSIM_Y: 0.8001

Every other chosen metric is shown on a line of its own after KAIR's, worded so that KAIR's parsers (which match
``- PSNR:`` and ``Average PSNR:``) never read it::

    Testing 000                  ( 0/4) + LPIPS: 0.1234; NIQE: 4.5678; tOF: 0.4321
    Average LPIPS: 0.1234; NIQE: 4.5678; tOF: 0.4321

Metrics are shown and written in registry order, whatever order they were asked for in. A metric without a value
for a frame (``tof``/``tlp`` at a clip's first frame) is left out of that frame's means.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from utils.metrics import DEFAULT_METRICS, METRICS, MetricError, MetricSpec, resolve

__all__ = ["DEFAULT_METRICS", "METRICS", "MetricError", "MetricSpec", "Scoring", "average_lines", "baseline_text",
           "clip_values", "frame_columns", "frame_names", "mean_over_clips", "metric_specs", "tag", "testing_lines"]

# The weight files' SHA-256 is checked when they load (metric values are comparable only with the published
# weights); the tests' generated stand-ins turn this off (tests/support), never a command line.
VERIFY_WEIGHTS = True


def metric_specs(names: Iterable[str] | None, have_gt: bool) -> list[MetricSpec]:
    """The specs of ``names`` (``None``: KAIR's four) in registry order.

    Raises:
        MetricError: an unknown name (did-you-mean), or a full-reference metric without ground truth.
    """
    chosen = {s.name for s in resolve(list(DEFAULT_METRICS if names is None else names), have_gt)}
    return [s for s in METRICS.values() if s.name in chosen]


class Scoring:
    """The chosen metrics of a run and what they load, once: the weight files (fetched on rank 0 when missing, see
    :func:`utils.metrics.weights.ensure_weights`; call on every rank) and the networks of LPIPS/DISTS/tLP on
    ``device``.

    Args:
        specs: from :func:`metric_specs` (empty: nothing is scored).
        device: where the perceptual networks run.
        weights_dir: the folder of the metric weights (None: ``model_zoo/metrics``).
        fetch: make sure the weight files are there first (a collective: every rank must call it together);
            ``False`` for a subset of metrics whose files a full set fetched already (any rank alone may build it).

    Raises:
        MetricError: a weight file missing offline or with the wrong SHA-256, vmaf without libvmaf (one line).
    """

    def __init__(self, specs: Sequence[MetricSpec], device: str | torch.device = "cpu",
                 weights_dir: str | None = None, fetch: bool = True) -> None:
        from utils.metrics.scorer import MetricSuite
        from utils.metrics.weights import ensure_weights

        self.specs = list(specs)
        self.device = torch.device(device)
        self.weights_dir = weights_dir
        self.columns = frame_columns(self.specs)
        self.names = [s.name for s in self.specs]
        if fetch:  # a collective (rank 0 fetches, every rank learns the outcome)
            ensure_weights(self.specs, weights_dir)
        self.suite = MetricSuite(self.specs, self.device, weights_dir, verify=VERIFY_WEIGHTS) if self.specs else None

        self._no_ref: Scoring | None = self if not any(s.needs_gt for s in self.specs) else None
        self._stream: Scoring | bool | None = None
        self._temporal: Scoring | bool | None = None

    def subset(self, names: Iterable[str]) -> Scoring | None:
        """The same metrics restricted to ``names`` (``None`` when none of them is chosen); its networks load again."""
        wanted = set(names)
        keep = [s for s in self.specs if s.name in wanted]
        return Scoring(keep, self.device, self.weights_dir, fetch=False) if keep else None

    def stream_scorer(self, clip: str = "") -> Any:
        """A :class:`utils.metrics.scorer.ClipScorer` of the per-frame metrics (VMAF, scored per clip, left out) for
        one stretch of a clip fed frame by frame; ``None`` when there are none."""
        if self._stream is None:
            per_frame = [s.name for s in self.specs if s.per_frame]
            self._stream = self if len(per_frame) == len(self.specs) else (self.subset(per_frame) or False)
        return self._stream.suite.scorer(clip) if self._stream else None

    def temporal_scoring(self) -> Scoring | None:
        """The temporal per-frame metrics (tOF, tLP) alone, built once: what :meth:`border` computes."""
        if self._temporal is None:
            self._temporal = self.subset(s.name for s in self.specs if s.per_frame and s.temporal) or False
        return self._temporal or None

    def border(self, before: tuple[np.ndarray, np.ndarray], first: tuple[np.ndarray, np.ndarray], index: int,
               clip: str = "") -> dict[str, float]:
        """The temporal metrics of frame ``index`` from frames ``index - 1`` (``before``) and ``index`` (``first``),
        each ``(output, GT)`` as (H, W, 3) uint8: the value a scorer fed the clip frame by frame has there.

        A segment's scorer has no previous frame at its first frame; joining segments fills that frame in with this.
        """
        assert self.suite is not None
        scorer = self.suite.scorer(clip)
        prev_out, prev_gt = (_float(a) for a in before)
        scorer.prime(prev_out, prev_gt, index - 1)
        out, gt = (_float(a)[None] for a in first)
        return scorer.update(out, gt, index)[0]

    def unfit(self, out: torch.Tensor, gt: torch.Tensor | None) -> dict[str, str]:
        """The metrics that refuse frames like these (too small for NIQE's blocks or tOF/tLP's crop), each with its
        one-line reason; full-reference ones are not tried without ``gt``. ``out``, ``gt``: a few (T, 3, H, W) frames
        of the kind to be scored (e.g. the input baseline of a clip's first two frames)."""
        refused = {}
        for spec in self.specs:
            if spec.needs_gt and gt is None:
                continue
            try:
                self.subset([spec.name]).score_clip(out, gt)  # type: ignore[union-attr]
            except MetricError as exc:
                refused[spec.name] = str(exc)
        return refused

    def no_reference(self) -> Scoring | None:
        """The no-reference metrics among these (for clips without ground truth), built once."""
        if self._no_ref is None and any(not s.needs_gt for s in self.specs):
            self._no_ref = self.subset(s.name for s in self.specs if not s.needs_gt)
        return self._no_ref

    def score_clip(self, out: torch.Tensor, gt: torch.Tensor | None, clip: str = "") -> tuple[list[dict[str, float]],
                                                                                               dict[str, float]]:
        """Score a whole clip at once: ``out``, ``gt``: (T, 3, H, W) in [0, 1] (``gt`` None: no-reference metrics
        only). Returns the per-frame values and the clip's value of each metric (:func:`clip_values`).

        Raises:
            MetricError: the clip is too short for a chosen metric.
            ValueError: the shapes differ.
        """
        if self.suite is None:
            return [{} for _ in range(out.shape[0])], {}
        scorer = self.suite.scorer(clip)
        frames = scorer.update(out, gt, 0)
        pooled = scorer.finish()
        for spec in self.specs:
            if not spec.per_frame:  # a per-clip metric's per-frame values come with its pooled value
                for index, value in scorer.frame_values.get(spec.name, {}).items():
                    frames[index][spec.name] = value
        return frames, clip_values(frames, self.specs, {k: v for k, v in pooled.items() if not METRICS[k].per_frame})


def _float(rgb: np.ndarray) -> torch.Tensor:
    """(H, W, 3) uint8 -> (3, H, W) float in [0, 1], contiguous (a channels-last tensor would take other
    convolution kernels in the metric networks, and their last bits differ from the stream's)."""
    return (torch.from_numpy(np.ascontiguousarray(rgb)).permute(2, 0, 1).float() / 255).contiguous()


def frame_columns(specs: Sequence[MetricSpec]) -> list[MetricSpec]:
    """The metrics with a value per frame: every ``per_frame`` one, and ``vmaf`` (libvmaf's per-frame scores,
    whose pooled mean is the clip's value)."""
    return [s for s in specs if s.per_frame or s.temporal]


def _has(value: Any) -> bool:
    return value is not None and not (isinstance(value, float) and math.isnan(value))


def clip_values(frames: Sequence[Mapping[str, float]], specs: Sequence[MetricSpec],
                pooled: Mapping[str, float] | None = None) -> dict[str, float]:
    """A clip's value of each metric: the mean over its frames that have one (the reference averages frames within
    a clip, then clips), or the pooled value a per-clip metric computed itself (``pooled``, e.g. VMAF's)."""
    out: dict[str, float] = {}
    for spec in specs:
        if pooled is not None and spec.name in pooled:
            out[spec.name] = float(pooled[spec.name])
            continue
        values = [f[spec.name] for f in frames if _has(f.get(spec.name))]
        if values:
            out[spec.name] = sum(values) / len(values)
    return out


def mean_over_clips(clips: Sequence[Mapping[str, float]], specs: Sequence[MetricSpec]) -> dict[str, float]:
    """The mean over clips of each metric, over the clips that have it."""
    return clip_values(clips, specs)


def frame_names(paths: Any, count: int) -> list[str]:
    """Names of ``count`` output frames from the item's frame paths: all of them when they match, the middle one
    for a single output frame (Vimeo centre frame, interpolation), else the first ``count``; ``00000000``... when
    the item has no usable paths."""
    if isinstance(paths, (list, tuple)) and len(paths) >= count and all(isinstance(p, str) for p in paths):
        names = [os.path.basename(p).split(".")[0] for p in paths]
        start = (len(names) - count) // 2 if count == 1 else 0
        return names[start:start + count]
    return [f"{i:08d}" for i in range(count)]


def _split(specs: Sequence[MetricSpec]) -> tuple[list[MetricSpec], list[MetricSpec]]:
    kair = [s for s in specs if s.family == "kair"]
    return kair, [s for s in specs if s.family != "kair"]


def _fields(values: Mapping[str, float], specs: Sequence[MetricSpec], sep: str = ": ") -> str:
    return "; ".join(f"{s.label}{sep}{s.format(values[s.name])}" for s in specs if s.name in values)


def testing_lines(name: str, index: int, total: int, values: Mapping[str, float] | None,
                  specs: Sequence[MetricSpec] = ()) -> list[str]:
    """A clip's lines: KAIR's ``Testing <clip> ( i/n) - PSNR: x dB; SSIM: x; PSNR_Y: x dB; SSIM_Y: x`` (``- no
    ground truth`` for a clip without), then ``Testing <clip> ( i/n) + LPIPS: x; ...`` for the other metrics.

    Args:
        values: the clip's value of each metric (``None`` or empty: nothing was scored).
        specs: the chosen metrics (default: KAIR's four).
    """
    specs = list(specs) or metric_specs(None, True)
    head = f"Testing {name:<20s} ({index:2d}/{total})"
    values = values or {}
    kair, other = _split(specs)
    lines = []
    kair_text = _fields(values, kair)
    if kair_text:
        lines.append(f"{head} - {kair_text}")
    elif kair or not other:
        lines.append(f"{head} - no ground truth")
    other_text = _fields(values, other)
    if other_text:
        lines.append(f"{head} + {other_text}")
    return lines


def average_lines(values: Mapping[str, float], specs: Sequence[MetricSpec] = ()) -> list[str]:
    """``Average PSNR: x dB; SSIM: x; PSNR_Y: x dB; SSIM_Y: x`` (KAIR's wording), then ``Average LPIPS: x; ...``
    for the other metrics; only metrics with a value."""
    specs = list(specs) or metric_specs(None, True)
    return [f"Average {text}" for text in (_fields(values, group) for group in _split(specs)) if text]


def baseline_text(values: Mapping[str, float], specs: Sequence[MetricSpec] = ()) -> str:
    """The input baseline's line, worded so that KAIR's log parsers (which match ``Average PSNR:`` and
    ``- PSNR:``) never take it for the model's score: ``Input baseline (...): PSNR x dB; SSIM x; ...; NIQE x``."""
    specs = list(specs) or metric_specs(None, True)
    return (f"Input baseline (the LQ input itself, bicubic-upsampled when scale > 1): "
            f"{_fields(values, specs, sep=' ')}")


def tag(spec: MetricSpec) -> str:
    """The scalar name under ``val/`` in TensorBoard and the trackers: the name upper-cased, kept as it is when it
    has an underscore (``PSNR``, ``SSIM``, ``psnr_y``, ``LPIPS``, ``lpips_vgg``, ``TOF``), as since the first
    release, so existing dashboards keep their curves."""
    return spec.name if "_" in spec.name else spec.name.upper()
