"""Tiled-inference benchmark: frames/s and peak memory of ``models.video_inference.infer_video`` on one clip.

Examples:
    python benchmarks/bench_infer.py                                   # tiny VRT, CPU
    python benchmarks/bench_infer.py --reference-dir /tmp/ref/JingyunLiang+VRT   # + the official tiling loop
    python benchmarks/bench_infer.py --task 001_VRT_videosr_bi_REDS_6frames --device cuda --amp none bf16 \
        --frames 40 --size 180 320 --tile 40 128 128

The network has random weights (speed does not depend on them). With ``--reference-dir`` the functions
``test_video``/``test_clip`` of ``<dir>/main_test_vrt.py`` (the official script, never part of this project) are
loaded on their own (the script's imports are not executed) and run on the same network, input and tiles, so the
two numbers compare the tiling loops. On CUDA the peak is ``max_memory_allocated``; on the CPU it is the rise of
the peak resident set size of a forked child that runs the measurement. One JSON line per measurement.
"""

from __future__ import annotations

import argparse
import ast
import json
import multiprocessing as mp
import os
import resource
import sys
import time
import types
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from models.model_zoo import TASKS  # noqa: E402
from models.net_io import net_io
from models.select_network import define_network  # noqa: E402
from models.video_inference import infer_video  # noqa: E402

TINY = {"upscale": 4, "img_size": [6, 64, 64], "window_size": [6, 8, 8], "depths": [2] * 7 + [2] * 6,
        "indep_reconsts": [11, 12], "embed_dims": [24] * 7 + [36] * 6, "num_heads": [3] * 13, "pa_frames": 2,
        "deformable_groups": 4}
AMP = {"none": None, "bf16": torch.bfloat16, "fp16": torch.float16}


def load_reference_tiling(ref_dir: str) -> types.SimpleNamespace:
    """``test_video``/``test_clip`` of ``<ref_dir>/main_test_vrt.py``, compiled without the script's imports."""
    path = os.path.join(ref_dir, "main_test_vrt.py")
    tree = ast.parse(Path(path).read_text())
    wanted = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in ("test_video", "test_clip")]
    if len(wanted) != 2:
        raise SystemExit(f"{path} has no test_video/test_clip functions")
    namespace: dict[str, Any] = {"torch": torch}
    exec(compile(ast.Module(body=wanted, type_ignores=[]), path, "exec"), namespace)  # noqa: S102
    return types.SimpleNamespace(test_video=namespace["test_video"])


def _measure(kind: str, args: argparse.Namespace, amp: str, queue: Any) -> None:
    device = torch.device(args.device)
    torch.manual_seed(0)
    if args.task == "tiny":
        net_type, kwargs = "vrt", dict(TINY)
    else:
        spec = TASKS[args.task]
        net_type, kwargs = spec.net_type, spec.net_kwargs()
    net = define_network(net_type, kwargs).eval().to(device)
    io = net_io(net)
    scale, window, nonblind, channels = io.scale, io.input_multiple, io.noise_map, io.in_chans
    lq = torch.rand(1, args.frames, channels, *args.size, generator=torch.Generator().manual_seed(0))
    tile, overlap = args.tile, args.tile_overlap
    if kind == "ours":
        def call() -> torch.Tensor:
            return infer_video(net, lq, scale=scale, window_size=window, num_frame_testing=tile[0],
                               num_frame_overlapping=overlap[0], size_patch_testing=tile[1], overlap_size=overlap[1],
                               in_chans=channels, device=device, autocast_dtype=AMP[amp])
    else:
        ref = load_reference_tiling(args.reference_dir)
        ns = types.SimpleNamespace(tile=list(tile), tile_overlap=list(overlap), scale=scale,
                                   window_size=list(window), nonblind_denoising=nonblind)

        def call() -> torch.Tensor:
            with torch.no_grad(), torch.autocast(device.type, dtype=AMP[amp], enabled=AMP[amp] is not None):
                return ref.test_video(lq.to(device), net, ns)
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    call()  # warm-up
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(args.repeat):
        start = time.perf_counter()
        call()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    if device.type == "cuda":
        peak_mib = torch.cuda.max_memory_allocated() / 2**20
    else:
        peak_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0) / 1024
    best = min(times)
    queue.put({"impl": kind, "task": args.task, "device": str(device), "amp": amp, "frames": args.frames,
               "size": args.size, "tile": tile, "tile_overlap": overlap, "seconds": round(best, 3),
               "frames_per_s": round(args.frames / best, 3), "peak_mib": round(peak_mib, 1),
               "threads": torch.get_num_threads()})


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--task", default="tiny", help=f"'tiny' or a released task: {', '.join(TASKS)}")
    p.add_argument("--device", default="cpu")
    p.add_argument("--amp", nargs="+", default=["none"], choices=sorted(AMP))
    p.add_argument("--frames", type=int, default=6)
    p.add_argument("--size", type=int, nargs=2, default=[96, 96], help="LQ height width")
    p.add_argument("--tile", type=int, nargs=2, default=[4, 64], help="frames, pixels (0 = no tiling)")
    p.add_argument("--tile_overlap", type=int, nargs=2, default=[2, 16])
    p.add_argument("--repeat", type=int, default=2)
    p.add_argument("--reference-dir", dest="reference_dir", default=None,
                   help="directory holding the official main_test_vrt.py (e.g. /tmp/ref/JingyunLiang+VRT)")
    args = p.parse_args()
    ctx = mp.get_context("fork" if args.device == "cpu" else "spawn")
    kinds = ["ours"] + (["reference"] if args.reference_dir else [])
    for amp in args.amp:
        for kind in kinds:
            queue = ctx.Queue()
            proc = ctx.Process(target=_measure, args=(kind, args, amp, queue))
            proc.start()
            proc.join()
            if proc.exitcode != 0 or queue.empty():
                raise SystemExit(f"the {kind} measurement failed (exit code {proc.exitcode}); see the error above")
            print(json.dumps(queue.get()), flush=True)  # noqa: T201


if __name__ == "__main__":
    main()
