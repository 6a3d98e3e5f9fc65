"""Tiled-inference benchmark: frames/s and peak memory of ``models.video_inference.infer_video`` on one clip.

Examples:
    python benchmarks/bench_infer.py                                   # tiny VRT, CPU
    python benchmarks/bench_infer.py --cli --task demo-sr2 --frames 64 --size 180 320 --cli-tile 16 0 0
    python benchmarks/bench_infer.py --cli --task 001_VRT_videosr_bi_REDS_6frames --frames 3 --size 180 320 \
        --tree /tmp/base_tree                                          # main_test_vrt.py of another checkout too
    python benchmarks/bench_infer.py --reference-dir /tmp/ref/JingyunLiang+VRT   # + the official tiling loop
    python benchmarks/bench_infer.py --task 001_VRT_videosr_bi_REDS_6frames --device cuda --amp none bf16 \
        --frames 40 --size 180 320 --tile 40 128 128

The network has random weights (speed does not depend on them). With ``--reference-dir`` the functions
``test_video``/``test_clip`` of ``<dir>/main_test_vrt.py`` (the official script, never part of this project) are
loaded on their own (the script's imports are not executed) and run on the same network, input and tiles, so the
two numbers compare the tiling loops; with ``--reference-net`` the reference run also uses that directory's
``models/network_vrt.py`` (given our weights), so the two numbers compare whole evaluations. On CUDA the peak is
``max_memory_allocated``; on the CPU it is the rise of the peak resident set size of a forked child that runs the
measurement. One JSON line per measurement.

``--cli`` measures what a user sees instead: ``main_test_vrt.py`` restores a clip of PNG frames (smooth random
content, written once to a scratch directory) on the CPU, in its own process, with random weights saved as a
checkpoint; frames/s is the script's own ``Restored N frames in S s`` line (network and tiling, not start-up), the
peak host memory that process's peak resident set size (``wait4``), interpreter, torch and data included. ``--task``
is a released task or ``demo`` (the built-in demo's tiny VRT, denoising) / ``demo-sr2`` (the same network as an x2
super-resolution model); ``--cli-tile``/``--cli-overlap`` are its ``--tile``/``--tile_overlap`` (default: the
script's own). ``--tree DIR`` runs the ``main_test_vrt.py`` of another checkout (e.g. an older commit extracted
with ``git archive``) on the same clip and weights, alternately with this one, ``--repeat`` times each
(``--tree-only``: that checkout alone). Each line names the checkout's commit (``+``: with changes not committed; an
extracted tree: its folder's name).
"""

from __future__ import annotations

import argparse
import ast
import json
import multiprocessing as mp
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from models.model_zoo import TASKS  # noqa: E402
from models.net_io import net_io  # noqa: E402
from models.select_network import define_network, network_kwargs  # noqa: E402
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
        if args.reference_net:  # the reference's own VRT, with our weights
            from benchmarks.bench_vrt import _load_reference

            ref_kwargs = {k: list(v) if isinstance(v, tuple) else v for k, v in kwargs.items()}
            reference = _load_reference(args.reference_dir)(**ref_kwargs).eval().to(device)
            reference.load_state_dict(net.state_dict(), strict=True)
            net = reference
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


ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "options" / "vrt" / "000_train_vrt_demo.json"


def _demo_option(variant: str, work: Path) -> tuple[Path, str, dict[str, Any]]:
    """The demo's option file (``demo``) or its x2 super-resolution variant (``demo-sr2``), under ``work``."""
    from utils import utils_option

    tree = utils_option.load_json(str(DEMO))
    tree["task"] = f"bench_{variant}"
    tree["path"]["root"] = str(work / "experiments")
    if variant == "demo-sr2":
        tree["scale"] = tree["netG"]["upscale"] = 2
        tree["netG"]["nonblind_denoising"] = False
        for part in tree["datasets"].values():
            part["task"] = "sr"
            for key in ("sigma", "sigma_min", "sigma_max"):
                part.pop(key, None)
    path = work / f"{variant}.json"
    path.write_text(json.dumps(tree, indent=1))
    return path, "vrt", network_kwargs(tree["netG"])


def _clip(work: Path, frames: int, size: tuple[int, int]) -> Path:
    """``frames`` PNG frames of ``size`` (smooth random content drifting across the frame), written once."""
    import cv2
    import numpy as np

    folder = work / f"lq_{frames}x{size[0]}x{size[1]}" / "clip"
    if folder.is_dir() and len(list(folder.glob("*.png"))) == frames:
        return folder.parent
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    base = cv2.GaussianBlur((rng.random((size[0] + frames, size[1] + 2 * frames, 3)) * 255).astype(np.uint8),
                            (0, 0), 3)
    for t in range(frames):
        cv2.imwrite(str(folder / f"{t:08d}.png"), base[t:t + size[0], 2 * t:2 * t + size[1]])
    return folder.parent


def _run_cli(tree: Path, argv: list[str], threads: int) -> dict[str, Any]:
    """Run ``tree/main_test_vrt.py argv`` in its own process; its frames/s line and peak RSS."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONPATH": str(tree)}
    proc = subprocess.Popen([sys.executable, str(tree / "main_test_vrt.py"), *argv], cwd=str(tree), env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    output = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)  # reaps it, with its own resource usage
    code = proc.returncode = os.waitstatus_to_exitcode(status)
    found = re.search(r"Restored (\d+) frames in ([\d.]+) s \(([\d.]+) frames/s\)", output)
    if code != 0 or not found:
        raise SystemExit(f"{tree}/main_test_vrt.py failed (exit {code}):\n{output[-3000:]}")
    return {"frames": int(found.group(1)), "seconds": float(found.group(2)), "frames_per_s": float(found.group(3)),
            "peak_rss_gib": round(usage.ru_maxrss / 2**20, 2)}


def _commit(tree: Path) -> str:
    """The checkout's commit (``+`` when its tracked files differ from it), or the folder's name where it is not a
    git checkout (an extracted ``git archive``: name the folder after its commit)."""
    def git(*argv: str) -> str:
        return subprocess.run(["git", "-C", str(tree), *argv], capture_output=True, text=True).stdout.strip()

    if git("rev-parse", "--show-toplevel") != str(tree):
        return tree.name
    return git("rev-parse", "--short", "HEAD") + ("+" if git("status", "--porcelain", "--untracked-files=no") else "")


def cli(args: argparse.Namespace) -> None:
    """``main_test_vrt.py`` as users run it (see the module docstring); one JSON line per run."""
    work = Path(tempfile.gettempdir()) / "bench_infer_cli"
    work.mkdir(exist_ok=True)
    if args.task.startswith("demo"):
        opt, net_type, kwargs = _demo_option(args.task, work)
        select = ["--opt", str(opt)]
    else:
        spec = TASKS[args.task]
        net_type, kwargs = spec.net_type, spec.net_kwargs()
        select = ["--task", args.task]
    kwargs = {k: v for k, v in kwargs.items() if k != "net_type"}
    weights = work / f"{args.task}_random.pth"
    if not weights.is_file():
        torch.manual_seed(0)
        torch.save({"params": define_network(net_type, kwargs).state_dict()}, weights)
    lq = _clip(work, args.frames, tuple(args.size))
    argv = [*select, "--model_path", str(weights), "--folder_lq", str(lq), "--device", "cpu", "--no_resume",
            "--num_workers", "0"]
    if args.cli_tile:
        argv += ["--tile", *map(str, args.cli_tile)]
    if args.cli_overlap:
        argv += ["--tile_overlap", *map(str, args.cli_overlap)]
    trees = {"ours": ROOT, **({"tree": Path(args.tree).resolve()} if args.tree else {})}
    if args.tree_only:
        trees.pop("ours")
    for i in range(args.repeat):
        for name, tree in trees.items():
            run = _run_cli(tree, [*argv, "--save_dir", str(work / f"out_{name}")], args.threads)
            print(json.dumps({"impl": name, "tree": str(tree), "commit": _commit(tree), "task": args.task,
                              "lq": [args.frames, *args.size],
                              "tile": args.cli_tile, "tile_overlap": args.cli_overlap, "threads": args.threads,
                              "run": i, **run}), flush=True)  # noqa: T201


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--task", default="tiny", help=f"'tiny' or a released task: {', '.join(TASKS)}")
    p.add_argument("--device", default="cpu")
    p.add_argument("--amp", nargs="+", default=["none"], choices=sorted(AMP))
    p.add_argument("--frames", type=int, default=6)
    p.add_argument("--size", type=int, nargs=2, default=[96, 96], help="LQ height width")
    # a temporal tile shorter than the window shrinks the network's windows, which no released recipe does (their
    # tiles are 12-40 frames): KAIR's attention is then relatively cheaper (RESULTS.md)
    p.add_argument("--tile", type=int, nargs=2, default=[TINY["window_size"][0], 64],
                   help="frames, pixels (0 = no tiling); default: whole windows of the tiny preset")
    p.add_argument("--tile_overlap", type=int, nargs=2, default=[2, 16])
    p.add_argument("--repeat", type=int, default=2)
    p.add_argument("--reference-dir", dest="reference_dir", default=None,
                   help="directory holding the official main_test_vrt.py (e.g. /tmp/ref/JingyunLiang+VRT)")
    p.add_argument("--reference-net", dest="reference_net", action="store_true",
                   help="with --reference-dir: the reference run uses that directory's models/network_vrt.py too "
                        "(the whole reference evaluation), given our weights")
    p.add_argument("--cli", action="store_true", help="time main_test_vrt.py itself (see the module docstring)")
    p.add_argument("--cli-tile", dest="cli_tile", type=int, nargs="+", help="--cli: main_test_vrt.py --tile")
    p.add_argument("--cli-overlap", dest="cli_overlap", type=int, nargs="+",
                   help="--cli: main_test_vrt.py --tile_overlap")
    p.add_argument("--tree", help="--cli: also run the main_test_vrt.py of this checkout")
    p.add_argument("--tree-only", dest="tree_only", action="store_true",
                   help="--cli: run only the --tree checkout (e.g. a 'before' measured apart from the 'after')")
    p.add_argument("--threads", type=int, default=2, help="--cli: OMP_NUM_THREADS of the runs")
    args = p.parse_args()
    if args.cli:
        cli(args)
        return
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
