"""Wall time of ``main_test_vrt.py`` on one 100-frame clip, with KAIR's four metrics and with ``lpips niqe tof tlp``
(and ``vmaf``, and ``--report``) added: what the metrics cost in a whole evaluation, where the clip is also cut into
segments (the temporal terms at each border and VMAF's whole-clip pass are computed when the segments are joined).

The clip is a photograph (scikit-image's astronaut) filmed by a panning camera, 256 x 256 GT frames and their
bicubic 64 x 64 LQ, restored x4 by a tiny VRT (the tests' ``TINY_NET``, random weights: the cost is the
architecture's) with temporal tiles of 10 frames, or by the convolutional baseline (``--net baseline``: almost no
network cost, so the metrics' share is at its largest). The perceptual metrics use seeded stand-ins of the published
weights (the same architectures, so the same cost). Each setting runs in this process after a warm-up run.

    python benchmarks/bench_eval_metrics.py --threads 2
    python benchmarks/bench_eval_metrics.py --threads 2 --net baseline --frames 100
"""

from __future__ import annotations

import argparse
import copy
import json
import logging
import os
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..")))

from engine import evaluate, scoring  # noqa: E402
from models.select_network import define_G  # noqa: E402
from tests.support.footage import downscale, pan, write_clip  # noqa: E402
from tests.support.helpers import TINY_OPT  # noqa: E402
from tests.support.metric_data import make_weights  # noqa: E402

NETS = {
    "vrt": {"net_type": "vrt", "upscale": 4, "img_size": [2, 40, 40], "window_size": [2, 4, 4],
            "depths": [1] * 7 + [1, 1], "embed_dims": [16] * 7 + [24, 24], "num_heads": [2] * 9,
            "indep_reconsts": [8], "drop_path_rate": 0.0, "deformable_groups": 4, "pa_frames": 2},
    "baseline": {"net_type": "videoconvbaseline", "upscale": 4, "num_feat": 8, "num_block": 1},
}
KAIR = ["psnr", "ssim", "psnr_y", "ssim_y"]
SETTINGS = {
    "KAIR's four": ["--metrics", *KAIR],
    "+ lpips niqe tof tlp": ["--metrics", *KAIR, "lpips", "niqe", "tof", "tlp"],
    "+ lpips niqe tof tlp vmaf": ["--metrics", *KAIR, "lpips", "niqe", "tof", "tlp", "vmaf"],
    "+ lpips niqe tof tlp, --report": ["--metrics", *KAIR, "lpips", "niqe", "tof", "tlp", "--report"],
}


def workspace(net: str, frames: int) -> tuple[str, list[str]]:
    """Write the option file, weights, clip and metric weights; return the folder and the common flags."""
    ws = tempfile.mkdtemp(prefix="bench_eval_metrics_")
    opt = copy.deepcopy(TINY_OPT)
    opt.update(netG=NETS[net], val={"num_frame_testing": 10, "num_frame_overlapping": 2, "size_patch_testing": 0})
    opt["path"]["root"] = os.path.join(ws, "experiments")
    with open(os.path.join(ws, "opt.json"), "w") as f:
        json.dump(opt, f)
    torch.manual_seed(0)
    torch.save({"params": define_G(opt).state_dict()}, os.path.join(ws, "w.pth"))
    gt = pan("astronaut", frames, (256, 256), step=(1, 2), start=(0, 0))
    write_clip(os.path.join(ws, "gt"), "pan", gt)
    write_clip(os.path.join(ws, "lq"), "pan", downscale(gt, 4))
    weights = make_weights(os.path.join(ws, "metric_weights"))
    flags = ["--opt", os.path.join(ws, "opt.json"), "--model_path", os.path.join(ws, "w.pth"), "--folder_lq",
             os.path.join(ws, "lq"), "--folder_gt", os.path.join(ws, "gt"), "--num_workers", "0", "--device", "cpu",
             "--metric_weights", weights, "--no_resume"]
    return ws, flags


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--net", choices=sorted(NETS), default="vrt")
    parser.add_argument("--frames", type=int, default=100)
    parser.add_argument("--segment_frames", type=int, default=25, help="segments of the clip (borders to join)")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    logging.basicConfig(level=logging.WARNING)
    scoring.VERIFY_WEIGHTS = False  # the seeded stand-ins
    ws, flags = workspace(args.net, args.frames)
    flags += ["--segment_frames", str(args.segment_frames)]
    assert evaluate.main([*flags, "--save_dir", os.path.join(ws, "warmup"), *SETTINGS["KAIR's four"]]) == 0
    base = None
    print(f"main_test_vrt.py, {args.net} x4, one {args.frames}-frame clip 64x64 -> 256x256, segments of "
          f"{args.segment_frames}, {args.threads} threads")
    for i, (name, extra) in enumerate(SETTINGS.items()):
        start = time.perf_counter()
        assert evaluate.main([*flags, "--save_dir", os.path.join(ws, f"run{i}"), *extra]) == 0
        took = time.perf_counter() - start
        base = base if base is not None else took
        print(f"  {name:34s} {took:7.2f} s  ({took / args.frames * 1000:6.1f} ms a frame, "
              f"+{(took - base) / args.frames * 1000:5.1f} ms a frame over KAIR's four)")


if __name__ == "__main__":
    main()
