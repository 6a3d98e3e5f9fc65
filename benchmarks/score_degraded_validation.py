"""Score a checkpoint on validation clips degraded with its training preset, against the degraded input itself.

The training validation of a real-world model runs on clean LQ clips (no test set applies ``degradations`` yet);
this renders the option file's ``SyntheticVideoTestDataset`` GT clips, degrades each with the training set's
``degradations`` and a fixed generator per clip (seed ``--seed + i``), and prints the PSNR of the bicubic-upsampled
degraded input and of the model's output (the metrics of validation: RGB, uint8 rounding, mean over frames, then
over clips).

    python benchmarks/score_degraded_validation.py --opt options/vrt/000_train_vrt_realworld_demo.json \\
        --model_path experiments/000_train_vrt_realworld_demo/models/250_G.pth --clips 8
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from data.dataset_synthetic import SyntheticVideoTestDataset  # noqa: E402
from data.degradation_pipeline import build_degradation  # noqa: E402
from engine.options import parse_options  # noqa: E402
from engine.validate import input_baseline  # noqa: E402
from models.select_network import define_G  # noqa: E402
from utils import utils_checkpoint as ckpt  # noqa: E402
from utils.utils_image import calculate_psnr  # noqa: E402


def psnr(video: torch.Tensor, gt: torch.Tensor) -> float:
    """Mean PSNR over frames; ``video``: (1, T, 3, H, W), ``gt``: (T, 3, H, W), both in [0, 1]."""
    to_uint8 = lambda t: (t.clamp(0, 1).permute(0, 2, 3, 1).numpy() * 255.0).round()  # noqa: E731
    return float(np.mean([calculate_psnr(a, b) for a, b in zip(to_uint8(video[0]), to_uint8(gt))]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--opt", required=True, help="the option file the checkpoint was trained with")
    parser.add_argument("--model_path", required=True, help="a _G.pth or _E.pth file")
    parser.add_argument("--clips", type=int, default=8, help="number of validation clips")
    parser.add_argument("--seed", type=int, default=1000, help="degradation seed of clip 0 (clip i: seed + i)")
    args = parser.parse_args(argv)
    opt = parse_options(args.opt)
    train, test = opt["datasets"]["train"], dict(opt["datasets"]["test"])
    if test["dataset_type"].lower() != "syntheticvideotestdataset" or not train.get("degradations"):
        print("needs a SyntheticVideoTestDataset test set and a training set with 'degradations'")
        return 1
    test["num_clips"] = args.clips
    clips = SyntheticVideoTestDataset(test)
    degrade = build_degradation(train["degradations"], opt["scale"])
    net = define_G(opt)
    ckpt.load_network(net, args.model_path, "params", strict=True)
    net.eval()
    rows = []
    for i in range(len(clips)):
        gt = clips[i]["H"]
        lq = degrade(gt.permute(0, 2, 3, 1).contiguous().numpy(), np.random.default_rng(args.seed + i))
        lq = torch.from_numpy(lq).permute(0, 3, 1, 2)[None]
        with torch.inference_mode():
            out = net(lq)
        rows.append((psnr(input_baseline(lq, out), gt), psnr(out, gt)))
    for i, (base, model) in enumerate(rows):
        print(f"clip {i:3d}: degraded input {base:6.2f} dB, model {model:6.2f} dB")
    base, model = np.mean(rows, axis=0)
    print(f"mean over {len(rows)} clips: degraded input {base:.2f} dB, model {model:.2f} dB ({model - base:+.2f} dB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
