"""The metric registry: one entry per metric name, read by validation, ``main_test_vrt.py``, the CSVs, the trackers
and the report (nothing else lists metric names).

A :class:`MetricSpec` says what a metric needs and how to show it; the computation lives in one module per family
(``utils/metrics/{lpips,dists,niqe,temporal,vmaf}.py``, PSNR/SSIM in ``utils/utils_image.py``) and is run over a
clip by :class:`utils.metrics.scorer.ClipScorer` (streaming, one per clip; see that module for the per-frame and
per-clip contract). Import what callers need from the package::

    from utils.metrics import METRICS, DEFAULT_METRICS, resolve, MetricError, MetricSuite, ClipScorer

Every mistake a user can make here (an unknown name, a full-reference metric without ground truth, a clip too short
for a temporal metric, a weights file that is missing or has the wrong hash, libvmaf missing) raises
:class:`MetricError`, one line, which the command lines map to exit code 2.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["DEFAULT_METRICS", "METRICS", "MetricError", "MetricSpec", "check_clip_length", "resolve"]


class MetricError(ValueError):
    """Bad metric input (name, ground truth, clip length, weights, libvmaf): the message is one line that names the
    value and what would be valid. Command lines print it and exit with code 2."""


@dataclass(frozen=True)
class MetricSpec:
    """What a metric is, needs and how it is shown.

    Attributes:
        name: the registry key (``psnr`` ... ``vmaf``); also the CSV column and the tracker tag.
        label: how log lines and report headers show it (``PSNR``, ``LPIPS``, ``tOF``).
        unit: ``'dB'`` or ``''``.
        fmt: format spec for logs (``'.2f'``, ``'.4f'``).
        needs_gt: a full-reference metric (compares the output with the ground truth).
        per_frame: the scorer returns a value for each output frame from :meth:`ClipScorer.update`; the per-clip value
            is the mean over the clip's frames that have one. False: only a per-clip value (see ``vmaf``).
        temporal: looks at more than one frame: ``tof``/``tlp`` give frame t from frames (t-1, t), so frame 0 of a
            clip has no value; ``vmaf``'s motion feature looks at neighbouring frames.
        higher_is_better: the direction (the best checkpoint is the max or the min).
        weights: keys of :data:`utils.metrics.weights.WEIGHTS` the metric loads (``()``: none to fetch).
        min_frames: the fewest frames a clip must have (2 for the temporal ones).
        family: the implementation that computes it; metrics of one family are computed together
            (``kair``: PSNR/SSIM and their Y variants in one pass).
        source: the definition it follows (shown in docs/metrics.md).
    """

    name: str
    label: str
    unit: str
    fmt: str
    needs_gt: bool
    per_frame: bool
    temporal: bool
    higher_is_better: bool
    weights: tuple[str, ...]
    min_frames: int
    family: str
    source: str

    def format(self, value: float) -> str:
        """``value`` as log lines show it: ``27.12 dB``, ``0.7812``."""
        text = format(value, self.fmt)
        return f"{text} {self.unit}" if self.unit else text

    def better(self, value: float, best: float | None) -> bool:
        """Whether ``value`` beats ``best`` in this metric's direction (``best`` None: nothing yet)."""
        if best is None:
            return True
        return value > best if self.higher_is_better else value < best


_KAIR = "KAIR utils_image (uint8 BGR, MATLAB-style SSIM, unrounded BT.601 Y)"

METRICS: dict[str, MetricSpec] = {s.name: s for s in (
    MetricSpec("psnr", "PSNR", "dB", ".2f", True, True, False, True, (), 1, "kair", _KAIR),
    MetricSpec("ssim", "SSIM", "", ".4f", True, True, False, True, (), 1, "kair", _KAIR),
    MetricSpec("psnr_y", "PSNR_Y", "dB", ".2f", True, True, False, True, (), 1, "kair", _KAIR),
    MetricSpec("ssim_y", "SSIM_Y", "", ".4f", True, True, False, True, (), 1, "kair", _KAIR),
    MetricSpec("lpips", "LPIPS", "", ".4f", True, True, False, False, ("alexnet", "lpips_alex"), 1, "lpips",
               "LPIPS v0.1, AlexNet (Zhang et al. 2018; the `lpips` package)"),
    MetricSpec("lpips_vgg", "LPIPS_VGG", "", ".4f", True, True, False, False, ("vgg16", "lpips_vgg"), 1, "lpips",
               "LPIPS v0.1, VGG16 (Zhang et al. 2018; the `lpips` package)"),
    MetricSpec("dists", "DISTS", "", ".4f", True, True, False, False, ("vgg16", "dists"), 1, "dists",
               "DISTS (Ding et al. 2020; the `DISTS_pytorch` package)"),
    MetricSpec("niqe", "NIQE", "", ".4f", False, True, False, False, (), 1, "niqe",
               "NIQE (Mittal et al. 2013), BasicSR's MATLAB-compatible calculate_niqe on Y"),
    MetricSpec("tof", "tOF", "", ".4f", True, True, True, False, (), 2, "temporal",
               "tOF (TecoGAN, Chu et al. 2020): Farneback flow of (t-1, t), output vs GT"),
    MetricSpec("tlp", "tLP", "", ".4f", True, True, True, False, ("alexnet", "lpips_alex"), 2, "temporal",
               "tLP (TecoGAN): LPIPS(t-1, t) of the output vs of the GT, x100"),
    MetricSpec("vmaf", "VMAF", "", ".2f", True, False, True, True, (), 1, "vmaf",
               "VMAF v0.6.1 through FFmpeg's libvmaf (pooled mean of per-frame scores)"),
)}

DEFAULT_METRICS: tuple[str, ...] = ("psnr", "ssim", "psnr_y", "ssim_y")


def resolve(names: Sequence[str], have_gt: bool) -> list[MetricSpec]:
    """The specs of ``names`` in the order given (a repeated name counts once).

    Args:
        names: registry keys, case-insensitive.
        have_gt: whether ground truth is available.

    Raises:
        MetricError: an unknown name (with the closest known one), or full-reference metrics without ground truth
            (naming every one of them).
    """
    specs: list[MetricSpec] = []
    for raw in names:
        name = str(raw).strip().lower()
        if name not in METRICS:
            close = difflib.get_close_matches(name, METRICS, n=1, cutoff=0.5)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise MetricError(f"unknown metric {raw!r}: {hint}known metrics: {', '.join(METRICS)}")
        if METRICS[name] not in specs:
            specs.append(METRICS[name])
    if not have_gt:
        full = [s.name for s in specs if s.needs_gt]
        if full:
            no_ref = ", ".join(s.name for s in METRICS.values() if not s.needs_gt)
            raise MetricError(f"metrics {', '.join(full)} need ground truth, which is missing; without it only "
                              f"no-reference metrics can be computed ({no_ref})")
    return specs


def check_clip_length(specs: Sequence[MetricSpec], frames: int, clip: str) -> None:
    """Refuse a clip with fewer frames than a chosen metric needs (call it before restoring the clip).

    Raises:
        MetricError: naming the clip, its length and the metrics that need more frames.
    """
    short = [f"{s.name} needs {s.min_frames}" for s in specs if frames < s.min_frames]
    if short:
        raise MetricError(f"clip {clip!r} has {frames} frame{'s' if frames != 1 else ''}, too few for "
                          f"{'; '.join(short)} (drop those metrics or use longer clips)")
