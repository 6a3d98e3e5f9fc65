"""The ``metrics`` section of ``benchmarks/gpu_suite.py``: the metric networks on the device (issue 26 item 10).

Per metric and frame size: ms per frame with the device's default batching (``frames_per_forward``) and with one
frame a forward, the batch size used, peak device memory; and whether a clip cut into uneven chunks and a primed
segment scores as the whole clip, bit for bit (a problem when not). Seeded stand-ins of the published weights (the
same architectures, so the same cost).
"""

from __future__ import annotations

import tempfile
from typing import Any

import torch

from benchmarks.bench_metrics import clip, per_frame_ms
from tests.support.metric_data import make_weights
from utils.metrics import resolve
from utils.metrics.scorer import MetricSuite, frames_per_forward

FULL = {"sizes": {"256": ((256, 256), 32), "1080p": ((1080, 1920), 4)},
        "metrics": ("lpips", "lpips_vgg", "dists", "tlp")}
QUICK = {"sizes": {"64x96": ((64, 96), 6)}, "metrics": ("lpips", "tlp")}


def _frames(size: tuple[int, int], frames: int) -> tuple[torch.Tensor, torch.Tensor]:
    """bench_metrics' photograph pan, or seeded noise where scikit-image (its photographs) is not installed, as on
    the lent GPU machines' image; the cost is the same."""
    try:
        return clip(size, frames)
    except ImportError:
        g = torch.Generator().manual_seed(0)
        gt = torch.rand(frames, 3, *size, generator=g)
        return (gt + 0.05 * torch.randn(gt.shape, generator=g)).clamp(0, 1), gt


def metrics_section(s: Any) -> dict[str, Any]:
    """Rows of (metric, size, frames, frames_per_forward, ms_per_frame, ms_per_frame_one, speedup, peak_gb,
    cut_invariant); ``s`` is the suite (its ``device``, ``quick``, ``problems``, ``over_budget``)."""
    plan = QUICK if s.quick else FULL
    weights = make_weights(tempfile.mkdtemp(prefix="gpu_suite_metric_weights_"))
    cuda = s.device.type == "cuda"
    rows = []
    for size_name, (size, frames) in plan["sizes"].items():
        out, gt = _frames(size, frames)
        for name in plan["metrics"]:
            if s.over_budget():
                rows.append({"metric": name, "size": size_name, "skipped": "time budget spent"})
                continue
            specs = resolve([name], True)
            if cuda:
                torch.cuda.reset_peak_memory_stats(s.device)
            batched = MetricSuite(specs, s.device, weights, verify=False)
            auto = per_frame_ms(batched, out, gt, repeats=2)
            peak = round(torch.cuda.max_memory_allocated(s.device) / 2**30, 2) if cuda else None
            one = per_frame_ms(MetricSuite(specs, s.device, weights, verify=False, batch_frames=1), out, gt, 2)
            whole = batched.scorer().update(out, gt, 0)
            cut = batched.scorer()
            third = max(1, frames // 3)
            chunks = [(0, third), (third, third + 1), (third + 1, frames)]
            rows_cut = [r for a, b in chunks for r in cut.update(out[a:b], gt[a:b], a)]
            segment = batched.scorer()
            segment.prime(out[third], gt[third], index=third)
            invariant = rows_cut == whole and segment.update(out[third + 1:], gt[third + 1:], third + 1) == \
                whole[third + 1:]
            if not invariant:
                s.problems.append(f"metrics: {name} at {size_name} scores a cut clip differently from the whole")
            rows.append({"metric": name, "size": size_name, "frames": frames,
                         "frames_per_forward": frames_per_forward(s.device, *size), "ms_per_frame": round(auto, 2),
                         "ms_per_frame_one": round(one, 2), "speedup": round(one / auto, 2), "peak_gb": peak,
                         "cut_invariant": invariant})
    return {"rows": rows}
