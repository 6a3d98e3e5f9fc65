"""Cost of each metric per frame (ms) on the CPU, at 256 x 256 and at 1080p, through the streaming scorer that
validation and ``main_test_vrt.py`` use, and the cost of the metrics of a 100-frame clip with and without
``lpips niqe tof tlp`` (the metrics alone: restoring the clip costs the same either way).

The perceptual networks use seeded stand-ins of the published weights (the same architectures, so the same cost).
Networks are timed with ``batch_frames`` 1 (the CPU's default) and 4 (frames batched in one forward, as off the
CPU), and against the reference packages' forwards (``lpips``, ``DISTS_pytorch``) on the same input, where
installed. ``--device cuda`` times the GPU where there is one.

    python benchmarks/bench_metrics.py --threads 2
    python benchmarks/bench_metrics.py --threads 2 --eval   # main_test_vrt.py on a 100-frame clip, +- metrics
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import warnings

import numpy as np
import torch

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..")))

from tests.support.metric_data import degrade, make_weights, photo  # noqa: E402
from utils.metrics import METRICS, resolve  # noqa: E402
from utils.metrics.scorer import MetricSuite  # noqa: E402

SIZES = {"256": (256, 256), "1080p": (1080, 1920)}


def clip(size: tuple[int, int], frames: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A pan over a photograph resized to ``size`` (GT) and its JPEG-degraded copy (output): (T, 3, H, W)."""
    import cv2

    h, w = size
    base = cv2.resize(photo("astronaut"), (w + 4 * frames, h + 2 * frames), interpolation=cv2.INTER_CUBIC)
    gt = np.stack([base[2 * t:2 * t + h, 4 * t:4 * t + w] for t in range(frames)])
    out = np.stack([degrade(f, "jpeg") for f in gt])
    to = lambda a: torch.from_numpy(a).permute(0, 3, 1, 2).float() / 255  # noqa: E731
    return to(out), to(gt)


def per_frame_ms(suite: MetricSuite, out: torch.Tensor, gt: torch.Tensor, repeats: int) -> float:
    """Median wall ms per frame of scoring the clip (one warm-up run)."""
    times = []
    for i in range(repeats + 1):
        scorer = suite.scorer()
        start = time.perf_counter()
        scorer.update(out, gt, 0)
        scorer.finish()
        if i:
            times.append(time.perf_counter() - start)
    return 1000 * float(np.median(times)) / len(out)


def reference_ms(name: str, out: torch.Tensor, gt: torch.Tensor, weights: str, device: torch.device) -> float | None:
    """ms per frame of the reference package's forward (frame by frame), or None where it is not installed."""
    try:
        if name in ("lpips", "lpips_vgg"):
            import lpips

            net = lpips.LPIPS(net="alex" if name == "lpips" else "vgg", pnet_rand=True, verbose=False).to(device)
            fn = lambda a, b: net(a, b, normalize=True)  # noqa: E731
        elif name == "dists":
            import DISTS_pytorch.DISTS_pt as ref
            import torchvision

            ref.models = type("m", (), {"vgg16": staticmethod(lambda **_: torchvision.models.vgg16(weights=None))})
            fn = ref.DISTS(load_weights=False).to(device)
        else:
            return None
    except ImportError:
        return None
    with torch.no_grad():
        fn(out[:1].to(device), gt[:1].to(device))
        start = time.perf_counter()
        for o, g in zip(out, gt):
            fn(o[None].to(device), g[None].to(device))
    return 1000 * (time.perf_counter() - start) / len(out)


def eval_seconds(frames: int, threads: int) -> None:
    """Wall seconds of ``main_test_vrt.py`` (in this process) restoring one ``frames``-frame clip (LQ 64 x 64 -> GT
    256 x 256, x4) with the tiny convolutional baseline, without and with ``--metrics ... lpips niqe tof tlp``."""
    import copy
    import json

    import cv2

    from engine import evaluate, scoring
    from models.network_baseline import VideoConvBaseline
    from tests.support.helpers import TINY_OPT

    ws = tempfile.mkdtemp(prefix="bench_eval_")
    opt = copy.deepcopy(TINY_OPT)
    opt["path"]["root"] = os.path.join(ws, "experiments")
    opt["val"] = {"num_frame_testing": 10, "num_frame_overlapping": 2}
    with open(os.path.join(ws, "opt.json"), "w") as fh:
        json.dump(opt, fh)
    ckpt = os.path.join(ws, "experiments", "tiny", "models", "5_G.pth")
    os.makedirs(os.path.dirname(ckpt))
    torch.manual_seed(0)
    torch.save({"params": VideoConvBaseline(upscale=4, num_feat=8, num_block=1).state_dict()}, ckpt)
    out, gt = clip((256, 256), frames)
    for t in range(frames):
        g = (gt[t].permute(1, 2, 0).numpy() * 255).round().astype(np.uint8)
        for sub, img in (("gt", g), ("lq", cv2.resize(g, (64, 64), interpolation=cv2.INTER_AREA))):
            os.makedirs(os.path.join(ws, sub, "000"), exist_ok=True)
            cv2.imwrite(os.path.join(ws, sub, "000", f"{t:08d}.png"), img[..., ::-1])
    weights = make_weights(os.path.join(ws, "metric_weights"))
    scoring.VERIFY_WEIGHTS = False  # the seeded stand-ins
    common = ["--opt", os.path.join(ws, "opt.json"), "--folder_lq", os.path.join(ws, "lq"), "--folder_gt",
              os.path.join(ws, "gt"), "--num_workers", "0", "--device", "cpu", "--metric_weights", weights]
    for i, extra in enumerate(([], ["--metrics", "psnr", "ssim", "psnr_y", "ssim_y", "lpips", "niqe", "tof",
                                    "tlp"])):
        start = time.perf_counter()
        code = evaluate.main([*common, "--save_dir", os.path.join(ws, f"run{i}"), *extra])
        took = time.perf_counter() - start
        print(f"main_test_vrt.py, {frames}-frame clip, {threads} threads, {' '.join(extra) or 'KAIR four'}: "
              f"{took:.2f} s (exit {code})", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--frames", type=int, nargs=2, default=(8, 2), help="frames at 256 and at 1080p")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--metrics", nargs="+", default=list(METRICS))
    parser.add_argument("--clip_frames", type=int, default=100, help="frames of the with/without clip (256 x 256)")
    parser.add_argument("--eval", action="store_true", help="time main_test_vrt.py with and without the metrics")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore")
    if args.eval:
        eval_seconds(args.clip_frames, args.threads)
        return 0
    device = torch.device(args.device)
    weights = make_weights(tempfile.mkdtemp(prefix="bench_metric_weights_"))
    print(f"torch {torch.__version__}, {args.threads} threads, device {device}")
    print("| metric | size | ms/frame (batch_frames 1) | ms/frame (batch_frames 4) | reference package ms/frame |")
    print("|---|---|---|---|---|")
    for size_name, frames in zip(SIZES, args.frames):
        out, gt = clip(SIZES[size_name], frames)
        for name in args.metrics:
            specs = resolve([name], True)
            one = per_frame_ms(MetricSuite(specs, device, weights, verify=False, batch_frames=1), out, gt,
                               args.repeats)
            net = name in ("lpips", "lpips_vgg", "dists", "tlp")
            four = (per_frame_ms(MetricSuite(specs, device, weights, verify=False, batch_frames=4), out, gt,
                                 args.repeats) if net else None)
            ref = reference_ms(name, out, gt, weights, device)
            cells = [f"{v:.1f}" if v is not None else "-" for v in (one, four, ref)]
            print(f"| {name} | {size_name} | {' | '.join(cells)} |", flush=True)
    out, gt = clip(SIZES["256"], args.clip_frames)
    for names in (["psnr", "ssim", "psnr_y", "ssim_y"], ["psnr", "ssim", "psnr_y", "ssim_y", "lpips", "niqe", "tof",
                                                          "tlp"]):
        suite = MetricSuite(resolve(names, True), device, weights, verify=False)
        start = time.perf_counter()
        scorer = suite.scorer()
        for a in range(0, len(out), 10):  # chunks of 10 frames, as a stream of temporal tiles delivers them
            scorer.update(out[a:a + 10], gt[a:a + 10], a)
        scorer.finish()
        print(f"{args.clip_frames}-frame 256x256 clip, {' '.join(names)}: {time.perf_counter() - start:.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
