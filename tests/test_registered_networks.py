"""Every registered network trains through main_train_vrt.py and evaluates through main_test_vrt.py --opt."""

from __future__ import annotations

import csv
import json
import os

import pytest

import main_test_vrt  # noqa: F401  (the entry script must import cleanly)
import main_train_vrt
from data.dataset_synthetic import SyntheticVideoTestDataset
from engine import evaluate
from models.select_network import NETWORKS
from tests.support.helpers import write_opt
from utils.utils_image import imwrite_rgb

# the smallest netG of each registered network that runs on 36x36 LQ frames, x4
TINY_NETS = {
    "vrt": {"net_type": "vrt", "upscale": 4, "img_size": [2, 40, 40], "window_size": [2, 4, 4], "depths": [1] * 8,
            "indep_reconsts": [], "embed_dims": [8] * 8, "num_heads": [1] * 8, "pa_frames": 2,
            "deformable_groups": 1, "spynet_path": None},
    "rvrt": {"net_type": "rvrt", "upscale": 4, "clip_size": 2, "window_size": [2, 4, 4], "num_blocks": [1, 1, 1],
             "depths": [1, 1, 1], "embed_dims": [8, 8, 8], "num_heads": [1, 1, 1], "deformable_groups": 2,
             "attention_heads": 2, "spynet_path": None},
    "videoconvbaseline": {"net_type": "videoconvbaseline", "upscale": 4, "num_feat": 8, "num_block": 1},
}


def test_every_registered_network_has_a_tiny_config():
    assert set(TINY_NETS) == set(NETWORKS)


def _write_clips(root, lq_size):
    """Two 4-frame synthetic clips as the official folder layout: ``root/{lq,gt}/<clip>/<frame>.png``."""
    data = SyntheticVideoTestDataset({"task": "sr", "num_clips": 2, "num_frame": 4, "lq_size": lq_size, "seed": 3,
                                      "scale": 4})
    for item in data:
        for side, frames in (("lq", item["L"]), ("gt", item["H"])):
            for t, frame in enumerate(frames):
                imwrite_rgb(os.path.join(root, side, item["folder"], f"{t:08d}.png"), frame)
    return os.path.join(root, "lq"), os.path.join(root, "gt")


@pytest.mark.parametrize("net_type", sorted(TINY_NETS))
def test_trains_and_evaluates_through_both_entry_scripts(net_type, tmp_path, monkeypatch, one_thread):
    for key in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.chdir(tmp_path)
    train = {"dataset_type": "SyntheticVideoTrainDataset", "gt_size": 160, "num_frame": 2, "num_clips": 2}
    opt = write_opt(tmp_path, netG=TINY_NETS[net_type], datasets={"train": train, "test": {"lq_size": [40, 40]}},
                    train={"total_iter": 1, "checkpoint_save": 1, "checkpoint_test": 1},
                    val={"num_frame_testing": 0, "size_patch_testing": 0})
    assert main_train_vrt.main(["--opt", opt, "--set", f"task={net_type}"]) == 0
    models = tmp_path / "experiments" / net_type / "models"
    assert (models / "1_G.pth").is_file() and (models / "1_state.pth").is_file()

    lq, gt = _write_clips(str(tmp_path / "clips"), [36, 36])
    save = str(tmp_path / "results")
    code = evaluate.main(["--opt", opt, "--set", f"task={net_type}", "--folder_lq", lq, "--folder_gt", gt,
                          "--device", "cpu", "--num_workers", "0", "--save_dir", save])
    assert code == 0
    with open(os.path.join(save, "metrics.csv")) as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 8 and all(float(r["psnr"]) > 10 for r in rows)  # 2 clips x 4 frames, a real restoration
    saved = [p for p in os.listdir(tmp_path / "experiments" / net_type / "options") if p.endswith(".json")]
    assert json.load(open(tmp_path / "experiments" / net_type / "options" / saved[0]))["netG"]["net_type"] == \
        net_type
