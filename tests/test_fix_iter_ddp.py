"""fix_iter crossing under 2-process DDP with activation checkpointing: no static graph, no crash, no lost step."""

from __future__ import annotations

import os

import torch

from tests.support.helpers import assert_ok, base_env, load_params, reports, torchrun, write_opt

TINY_VRT = {"net_type": "vrt", "upscale": 1, "img_size": [2, 64, 64], "window_size": [2, 8, 8],
            "depths": [1, 1, 1, 1, 1, 1, 1, 1, 1], "indep_reconsts": [8], "embed_dims": [8] * 7 + [12] * 2,
            "num_heads": [2] * 9, "pa_frames": 2, "deformable_groups": 2, "spynet_path": None,
            "use_checkpoint_attn": True, "use_checkpoint_ffn": True}


def test_fix_iter_crossing_under_ddp_with_checkpointing(tmp_path):
    report = tmp_path / "rep"
    report.mkdir()
    opt = write_opt(
        tmp_path, scale=1, netG=TINY_VRT,
        datasets={"train": {"task": "deblur", "gt_size": 64, "num_frame": 2},
                  "test": {"task": "deblur", "lq_size": [64, 64], "num_frame": 2, "num_clips": 1}},
        train={"total_iter": 3, "checkpoint_save": 1, "fix_iter": 3, "fix_keys": ["spynet", "deform"],
               "fix_lr_mul": 0.125, "G_optimizer_lr": 1e-3})
    proc = torchrun(2, ["--opt", opt], base_env(str(report)), str(tmp_path), timeout=400)
    assert_ok(proc)
    log = open(tmp_path / "experiments" / "tiny" / "train.log").read()
    assert "Freeze" in log and "at step 1" in log and "Unfreeze" in log and "at step 3" in log
    reps = reports(str(report))
    assert len(reps) == 2 and reps[0]["checksum"] == reps[1]["checksum"]
    models = tmp_path / "experiments" / "tiny" / "models"
    w1, w2, w3 = (load_params(str(models / f"{s}_G.pth")) for s in (1, 2, 3))
    fixed = [k for k in w1 if ("spynet" in k or "deform" in k) and w1[k].is_floating_point()]
    normal = [k for k in w1 if k not in fixed and k.endswith("weight")]
    assert all(torch.equal(w1[k], w2[k]) for k in fixed)  # frozen before fix_iter
    assert any(not torch.equal(w1[k], w2[k]) for k in normal)
    assert any(not torch.equal(w2[k], w3[k]) for k in fixed)  # trained from fix_iter on, no crash, no lost step
    assert sorted(os.listdir(models)) == sorted(f"{s}_{kind}.pth" for s in (1, 2, 3)
                                                for kind in ("G", "optimizerG", "state"))
