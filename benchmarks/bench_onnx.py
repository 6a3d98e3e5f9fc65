"""ONNX Runtime vs eager PyTorch on the CPU: frames/s of one tile, and the export's largest difference.

Examples:
    python benchmarks/bench_onnx.py                                    # tiny VRT and RVRT
    python benchmarks/bench_onnx.py --nets vrt001 rvrt001 --tile 6 64 64 --repeats 2

Each network gets random weights (seeded; speed does not depend on them), is exported by ``scripts/export.py`` (the
exporter's own check against PyTorch runs) to a temporary folder, and one tile ``(1, T, C, H, W)`` is run
``--repeats`` times by eager PyTorch (``torch.inference_mode``) and by an ONNX Runtime CPU session at ``--threads``
intra-op threads, after one warm-up run each. One JSON line per network: seconds per tile (median) and frames/s
(T / seconds). ``vrt001``/``rvrt001`` are the released ``001_VRT_videosr_bi_REDS_6frames`` and
``001_RVRT_videosr_bi_REDS_30frames`` architectures.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from models.model_zoo import TASKS  # noqa: E402
from models.onnx_runner import OnnxNetwork  # noqa: E402
from models.select_network import define_network  # noqa: E402
from scripts import export  # noqa: E402

TINY = {
    "vrt": {"upscale": 4, "img_size": [2, 64, 64], "window_size": [2, 8, 8], "depths": [1] * 8,
            "indep_reconsts": [], "embed_dims": [16] * 8, "num_heads": [2] * 8, "pa_frames": 2,
            "deformable_groups": 2},
    "rvrt": {"upscale": 4, "clip_size": 2, "window_size": [2, 8, 8], "num_blocks": [1, 1, 1], "depths": [1, 1, 1],
             "embed_dims": [16, 16, 16], "num_heads": [2, 2, 2], "deformable_groups": 2, "attention_heads": 2},
}
PUBLISHED = {"vrt001": "001_VRT_videosr_bi_REDS_6frames", "rvrt001": "001_RVRT_videosr_bi_REDS_30frames"}


def _median_seconds(fn, x: torch.Tensor, repeats: int) -> float:
    fn(x)  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn(x)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def bench(name: str, tile: tuple[int, int, int], repeats: int, threads: int, folder: str) -> dict:
    torch.manual_seed(0)
    if name in PUBLISHED:
        spec = TASKS[PUBLISHED[name]]
        net = define_network(spec.net_type, spec.net_kwargs())
        source = ["--task", spec.name]
    else:
        net = define_network(name, dict(TINY[name]))
        opt = {"task": f"tiny_{name}", "model": "vrt", "scale": 4, "path": {"root": folder},
               "netG": {"net_type": name, **TINY[name]}}
        opt_path = os.path.join(folder, f"{name}.json")
        with open(opt_path, "w") as f:
            json.dump(opt, f)
        source = ["--opt", opt_path]
    weights = os.path.join(folder, f"{name}.pth")
    torch.save({"params": net.state_dict()}, weights)
    out = os.path.join(folder, f"{name}.onnx")
    start = time.perf_counter()
    if export.main([*source, "--model_path", weights, "--tile", *map(str, tile), "--out", out]) != 0:
        raise SystemExit(f"export of {name} failed")
    export_s = time.perf_counter() - start
    torch.set_num_threads(threads)
    runner = OnnxNetwork(out, providers=["CPUExecutionProvider"], threads=threads)
    x = torch.rand(1, tile[0], net.io.in_chans, tile[1], tile[2], generator=torch.Generator().manual_seed(1))
    net.eval()
    with torch.inference_mode():
        eager = _median_seconds(net, x, repeats)
        ort = _median_seconds(runner, x, repeats)
        diff = float((runner(x) - net(x)).abs().max())
    return {"net": name, "tile": list(tile), "threads": threads, "export_s": round(export_s, 1),
            "max_abs_diff": diff, "eager_s": round(eager, 3), "ort_s": round(ort, 3),
            "eager_fps": round(tile[0] / eager, 2), "ort_fps": round(tile[0] / ort, 2),
            "params_m": round(sum(p.numel() for p in net.parameters()) / 1e6, 2)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nets", nargs="+", default=["vrt", "rvrt"], choices=[*TINY, *PUBLISHED])
    p.add_argument("--tile", type=int, nargs=3, default=[6, 64, 64], metavar=("T", "H", "W"))
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as folder:
        for name in args.nets:
            print(json.dumps(bench(name, tuple(args.tile), args.repeats, args.threads, folder)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
