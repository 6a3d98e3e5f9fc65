"""Speed of the on-the-fly degradations (data/degradation_*.py): ms per clip of each operation and of the presets,
and clips/s per loader worker, on one thread (as in a DataLoader worker: torch and OpenCV at 1 thread, BLAS at 1).

Clips are rendered by the synthetic scene generator (textured, moving content, so codecs predict between frames
as on real video), GT 256 x 256 RGB; ``--frames 30`` is RVRT's REDS recipe (options/rvrt/001, 30 frames of GT
256) and RealBasicVSR's 15 frames mirrored to 30; ``--frames 6`` is VRT 001's clip (6 frames of GT 256, LQ 64).

    python benchmarks/bench_degradations.py --frames 6 30 --clips 12
"""

from __future__ import annotations

import argparse
import os
import sys
import time

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")  # before NumPy loads its BLAS: one core per loader worker

import cv2  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..")))

from data import degradations as dg  # noqa: E402
from data.dataset_synthetic import render_clip  # noqa: E402
from data.degradation_codec import available_encoders, compress_clip  # noqa: E402
from data.degradation_pipeline import build_degradation  # noqa: E402


def clocked(fn) -> tuple[float, float]:
    """``(CPU ms, wall ms)`` of one call. Everything runs on one thread, so the CPU time is what the call costs on a
    core of its own; the wall time also counts waiting for the core on a loaded machine."""
    cpu, wall = time.process_time(), time.perf_counter()
    fn()
    return 1000 * (time.process_time() - cpu), 1000 * (time.perf_counter() - wall)


def timed(fn, repeats: int) -> tuple[float, float]:
    """Median ``(CPU ms, wall ms)`` of ``repeats`` calls (after one warm-up call)."""
    fn()
    cpu, wall = zip(*(clocked(fn) for _ in range(repeats)))
    return float(np.median(cpu)), float(np.median(wall))


def operations(gt: np.ndarray, lq: np.ndarray, repeats: int) -> list[tuple[str, tuple[float, float]]]:
    """Each operation at fixed settings: on the GT-size clip, and the codecs also on the LQ-size clip."""
    rng = np.random.default_rng(0)
    t = gt.shape[0]
    k21 = dg.gaussian_kernel(21, 2.0, 1.0, 0.5)
    rows = [
        ("blur 21x21, one kernel", lambda: dg.filter_clip(gt, k21)),
        ("blur 21x21, a kernel per frame (vary)", lambda: dg.filter_clip(gt, np.stack([k21] * t))),
        ("blur 7x7", lambda: dg.filter_clip(gt, dg.gaussian_kernel(7, 1.0))),
        ("resize x0.5 area", lambda: dg.resize_clip(gt, (128, 128), "area")),
        ("resize x0.5 bicubic", lambda: dg.resize_clip(gt, (128, 128), "bicubic")),
        ("resize x1.5 bilinear", lambda: dg.resize_clip(gt, (384, 384), "bilinear")),
        ("noise gaussian, colour", lambda: dg.add_gaussian_noise(gt, np.full(t, 10.0), False, rng)),
        ("noise poisson, colour", lambda: dg.add_poisson_noise(gt, np.full(t, 1.0), False, rng)),
        ("noise poisson, grey", lambda: dg.add_poisson_noise(gt, np.full(t, 1.0), True, rng)),
        ("jpeg q60", lambda: dg.jpeg_clip(gt, np.full(t, 60))),
        ("bi x4 (MATLAB bicubic, float64)", lambda: dg.bi_downsample(gt, 4)),
        ("bd x4 (MATLAB Gaussian, float64)", lambda: dg.bd_downsample(gt, 4)),
        ("quantize", lambda: dg.quantize(gt)),
    ]
    settings = {"libx264": {"crf": 28}, "libx265": {"crf": 28}, "mpeg4": {"qscale": 10}, "libvpx-vp9": {"crf": 35}}
    for codec in available_encoders():
        for clip, where in ((gt, "GT size"), (lq, "LQ size")):
            rows.append((f"codec {codec} {settings[codec]} ({where})",
                         lambda c=codec, x=clip: compress_clip(x, c, **settings[c])))
    rows.append(("codec libx264 crf 28 veryfast (GT size)",
                 lambda: compress_clip(gt, "libx264", crf=28, preset="veryfast")))
    return [(name, timed(fn, repeats)) for name, fn in rows]


def presets(gt: np.ndarray, clips: int) -> list[tuple[str, float, float, float, float]]:
    """``(preset, mean, median, p90 CPU ms, mean wall ms)`` over ``clips`` seeds (the drawn parameters change the
    cost a lot)."""
    out = []
    for name in ("bi", "bd", "realesrgan", "realbasicvsr"):
        degrade = build_degradation(name, 4)
        degrade(gt, np.random.default_rng(10_000))  # warm-up
        cpu, wall = zip(*(clocked(lambda s=seed, d=degrade: d(gt, np.random.default_rng(s))) for seed in range(clips)))
        out.append((name, float(np.mean(cpu)), float(np.median(cpu)), float(np.percentile(cpu, 90)),
                    float(np.mean(wall))))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--frames", type=int, nargs="+", default=[6, 30], help="frames per clip")
    parser.add_argument("--size", type=int, default=256, help="GT side")
    parser.add_argument("--clips", type=int, default=12, help="clips (seeds) per preset")
    parser.add_argument("--repeats", type=int, default=3, help="timed calls per operation")
    parser.add_argument("--skip-ops", action="store_true", help="time the presets only")
    args = parser.parse_args()
    torch.set_num_threads(1)
    cv2.setNumThreads(1)
    need = 8 / 4 / 1.0  # VRT 001: 8 clips per ~1 s step, 4 workers
    for frames in args.frames:
        gt = render_clip(np.random.default_rng(0), frames, args.size, args.size)
        lq = dg.resize_clip(gt, (args.size // 4, args.size // 4), "area")
        print(f"\n## {frames} frames of {args.size}x{args.size} GT (LQ {args.size // 4}), 1 thread")
        if not args.skip_ops:
            print("\n| operation | CPU ms per clip | wall ms |\n|---|---|---|")
            for name, (cpu, wall) in operations(gt, lq, args.repeats):
                print(f"| {name} | {cpu:.1f} | {wall:.1f} |")
        print(f"\n| preset (x4) | mean CPU ms | median | p90 | mean wall ms | clips/s per worker (CPU) | 4 workers "
              f"/ {need * 4:g} clips/s |\n|---|---|---|---|---|---|---|")
        for name, mean, median, p90, wall in presets(gt, args.clips):
            rate = 1000 / mean
            print(f"| {name} | {mean:.0f} | {median:.0f} | {p90:.0f} | {wall:.0f} | {rate:.2f} | "
                  f"{4 * rate / (need * 4):.1f}x |")


if __name__ == "__main__":
    main()
