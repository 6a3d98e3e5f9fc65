"""Streaming-evaluation benchmark: peak host memory and frames/s of ``main_test_vrt.py`` against the video length.

Examples:
    python benchmarks/bench_stream.py                                   # 100, 1,000 and 10,000 frames, CPU
    python benchmarks/bench_stream.py --whole 100 1000                  # + the whole-clip path at those lengths
    python benchmarks/bench_stream.py --frames 100000 --size 32 32      # longer, smaller

For each length the script writes (once, cached in ``--workdir``) an LQ video and its x4 GT (lossless FFV1
``.mkv``, smooth moving content), then runs ``main_test_vrt.py`` on them in a fresh process: a tiny
``videoconvbaseline`` network (random weights: speed does not depend on them) restores every frame with temporal
tiles, each frame is scored against its GT (PSNR/SSIM, RGB and Y) and, with ``--save_result``, written as PNG. The
numbers are those of the run's closing summary line: frames restored, seconds of the restoration phase, frames/s
and the process's peak resident memory (``ru_maxrss``, which includes the interpreter, torch and the network); and
frames per CPU-second of the restoration phase (all threads of the process: reading, network, scoring, writing),
which other work on a shared machine disturbs far less than the wall clock.

``--whole N ...`` also measures the whole-clip path (what ``main_test_vrt.py`` did before streaming: decode the whole
video into memory, ``infer_video`` on it, score the frames), in a fresh process per length.

Each measurement is repeated (``--repeat``) and the best frames/s kept (the largest peak memory), since other work on
a shared machine only ever slows a run down. One JSON line per run, then a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from data.dataset_video_file import VideoFileTestDataset  # noqa: E402
from engine.scoring import clip_scores  # noqa: E402
from models.network_baseline import VideoConvBaseline  # noqa: E402
from models.video_inference import infer_video  # noqa: E402
from utils.utils_video_file import VideoWriter  # noqa: E402

NET = {"net_type": "videoconvbaseline", "upscale": 4, "num_feat": 8, "num_block": 1}
SUMMARY = re.compile(r"Restored (\d+) frames in ([\d.]+) s \(([\d.]+) frames/s\).*peak host memory ([\d.]+) GiB")


def _frame(t: int, height: int, width: int) -> torch.Tensor:
    """``(3, H, W)`` smooth colour gradients drifting with ``t``, and a bright square moving across."""
    yy = torch.arange(height, dtype=torch.float32)[:, None]
    xx = torch.arange(width, dtype=torch.float32)[None, :]
    r = 0.5 + 0.4 * torch.sin((xx + 2 * t) / 9.0) + 0 * yy
    g = 0.5 + 0.4 * torch.cos((yy - t) / 11.0) + 0 * xx
    b = 0.5 + 0.3 * torch.sin((xx + yy + 3 * t) / 15.0)
    img = torch.stack([r, g, b])
    side = max(2, height // 4)
    x0, y0 = (3 * t) % (width - side), (2 * t) % (height - side)
    img[:, y0:y0 + side, x0:x0 + side] = torch.tensor([0.95, 0.9, 0.2])[:, None, None]
    return img


def make_videos(workdir: Path, frames: int, size: tuple[int, int]) -> tuple[Path, Path]:
    """``lq_<frames>.mkv`` (``size``) and ``gt_<frames>.mkv`` (x4), written frame by frame; reused when present."""
    tag = f"{frames}_{size[0]}x{size[1]}"
    lq_path, gt_path = workdir / f"lq_{tag}.mkv", workdir / f"gt_{tag}.mkv"
    if lq_path.exists() and gt_path.exists():
        return lq_path, gt_path
    height, width = size[0] * 4, size[1] * 4
    with VideoWriter(str(gt_path), 25) as gt_writer, VideoWriter(str(lq_path), 25) as lq_writer:
        for t in range(frames):
            gt = _frame(t, height, width)
            lq = torch.nn.functional.interpolate(gt[None], size=size, mode="bicubic", align_corners=False)[0]
            gt_writer.write(gt)
            lq_writer.write(lq.clamp(0, 1))
    return lq_path, gt_path


def make_model(workdir: Path, tile: tuple[int, int]) -> Path:
    """An option file with the tiny network and its checkpoint (``experiments/bench_stream/models/1_G.pth``)."""
    torch.manual_seed(0)
    net = VideoConvBaseline(**{k: v for k, v in NET.items() if k != "net_type"})
    models = workdir / "experiments" / "bench_stream" / "models"
    models.mkdir(parents=True, exist_ok=True)
    torch.save({"params": net.state_dict()}, models / "1_G.pth")
    opt = {"task": "bench_stream", "model": "vrt", "scale": 4, "n_channels": 3,
           "path": {"root": str(workdir / "experiments"), "pretrained_netG": None},
           "datasets": {}, "netG": NET, "train": {},
           "val": {"num_frame_testing": tile[0], "num_frame_overlapping": tile[1], "size_patch_testing": 0}}
    path = workdir / "opt.json"
    path.write_text(json.dumps(opt, indent=1))
    return path


def _stream_child(args: list[str]) -> None:
    """``main_test_vrt.py``'s main in this (fresh) process; prints its summary line and the CPU seconds of its
    restoration phase."""
    import io
    import logging

    from engine import evaluate

    stream = io.StringIO()
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=stream)
    restore, spent = evaluate._restore, []

    def timed_restore(*a, **kw):  # the CPU time of the restoration phase (reading, network, scoring, writing)
        cpu = time.process_time()
        try:
            return restore(*a, **kw)
        finally:
            spent.append(time.process_time() - cpu)

    evaluate._restore = timed_restore
    code = evaluate.main(args)
    cpu = sum(spent)
    match = SUMMARY.search(stream.getvalue())
    if code != 0 or match is None:
        raise SystemExit(f"main_test_vrt.py failed ({code}):\n{stream.getvalue()[-3000:]}")
    print(json.dumps({"summary": match.group(0), "cpu_s": round(cpu, 2)}))


def run_stream(opt: Path, lq: Path, gt: Path, out: Path, save_result: bool, threads: int) -> dict:
    """``main_test_vrt.py`` in a fresh process: the numbers of its summary line, and the CPU time (all threads) of
    its restoration phase."""
    args = ["--opt", str(opt), "--folder_lq", str(lq), "--folder_gt", str(gt), "--device", "cpu", "--num_workers",
            "0", "--save_dir", str(out), "--no_resume"] + (["--save_result"] if save_result else [])
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "VRT_DEVICE": "cpu"}
    proc = subprocess.run([sys.executable, __file__, "--stream-child", *args], env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"main_test_vrt.py failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    match = SUMMARY.search(report["summary"])
    assert match is not None
    frames, seconds, fps, peak = match.groups()
    return {"impl": "stream", "frames": int(frames), "seconds": float(seconds), "frames_per_s": float(fps),
            "cpu_frames_per_s": round(int(frames) / report["cpu_s"], 2), "peak_rss_gib": float(peak)}


def _whole_child(opt_path: str, lq: str, gt: str, threads: int) -> None:
    """The whole-clip path, measured inside this (fresh) process; prints one JSON line."""
    torch.set_num_threads(threads)
    opt = json.loads(Path(opt_path).read_text())
    torch.manual_seed(0)
    net = VideoConvBaseline(**{k: v for k, v in NET.items() if k != "net_type"}).eval()
    val = opt["val"]
    start, cpu = time.perf_counter(), time.process_time()
    item = VideoFileTestDataset({"dataroot_lq": lq, "dataroot_gt": gt})[0]  # decodes both videos whole
    out = infer_video(net, item["L"][None], scale=4, window_size=(1, 1, 1), num_frame_testing=val["num_frame_testing"],
                      num_frame_overlapping=val["num_frame_overlapping"])[0]
    scores = clip_scores(out, item["H"])
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 2**30
    print(json.dumps({"impl": "whole", "frames": len(scores), "seconds": round(seconds, 2),
                      "frames_per_s": round(len(scores) / seconds, 2),
                      "cpu_frames_per_s": round(len(scores) / cpu, 2), "peak_rss_gib": round(peak, 2)}))


def run_whole(opt: Path, lq: Path, gt: Path, threads: int) -> dict:
    cmd = [sys.executable, __file__, "--whole-child", str(opt), str(lq), str(gt), str(threads)]
    proc = subprocess.run(cmd, env={**os.environ, "OMP_NUM_THREADS": str(threads)}, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"whole-clip run failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--whole-child":
        _whole_child(sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]))
        return
    if len(sys.argv) > 1 and sys.argv[1] == "--stream-child":
        _stream_child(sys.argv[2:])
        return
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--frames", type=int, nargs="+", default=[100, 1000, 10000], help="video lengths")
    p.add_argument("--size", type=int, nargs=2, default=[16, 16], help="LQ frame height, width (the output is x4)")
    p.add_argument("--tile", type=int, nargs=2, default=[10, 2], help="temporal tile and overlap")
    p.add_argument("--threads", type=int, default=1, help="OMP_NUM_THREADS of the measured processes")
    p.add_argument("--repeat", type=int, default=3, help="runs per measurement (the best frames/s is reported)")
    p.add_argument("--save_result", action="store_true", help="also write every output frame as PNG")
    p.add_argument("--whole", type=int, nargs="*", default=[], metavar="FRAMES",
                   help="also measure the whole-clip path at these lengths (among --frames)")
    p.add_argument("--workdir", type=str, default="/tmp/bench_stream", help="videos and outputs (cached)")
    args = p.parse_args()
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    opt = make_model(workdir, tuple(args.tile))
    rows = []
    for frames in args.frames:
        lq, gt = make_videos(workdir, frames, tuple(args.size))
        impls = ["stream", "whole"] if frames in args.whole else ["stream"]
        repeats: dict[str, list[dict]] = {impl: [] for impl in impls}
        for _ in range(args.repeat):  # interleaved, so that both see the same load of a shared machine
            for impl in impls:
                if impl == "stream":
                    row = run_stream(opt, lq, gt, workdir / f"out_{frames}", args.save_result, args.threads)
                else:
                    row = run_whole(opt, lq, gt, args.threads)
                repeats[impl].append(row)
                print(json.dumps(row), flush=True)
        for runs in repeats.values():
            best = max(runs, key=lambda r: r["frames_per_s"])
            rows.append({**best, "cpu_frames_per_s": max(r["cpu_frames_per_s"] for r in runs),
                         "peak_rss_gib": max(r["peak_rss_gib"] for r in runs)})
    print(f"\nbest of {args.repeat}:\n| impl | frames | seconds | frames/s | frames per CPU-second | peak RSS (GiB) |"
          "\n|---|---|---|---|---|---|")
    for row in rows:
        print(f"| {row['impl']} | {row['frames']:,} | {row['seconds']:.1f} | {row['frames_per_s']:.1f} | "
              f"{row['cpu_frames_per_s']:.1f} | {row['peak_rss_gib']:.2f} |")
    stream = [r for r in rows if r["impl"] == "stream"]
    if len(stream) > 1:
        for key in ("frames_per_s", "cpu_frames_per_s", "peak_rss_gib"):
            values = [r[key] for r in stream]
            spread = (max(values) - min(values)) / min(values) if min(values) else math.inf
            lengths = ", ".join(f"{r['frames']:,}" for r in stream)
            print(f"streaming {key}: spread {100 * spread:.1f}% over {lengths} frames")


if __name__ == "__main__":
    main()
