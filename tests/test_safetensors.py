"""Weights as safetensors: ``scripts/export.py --format safetensors`` writes G or the EMA with the options in the
metadata; training (``path.pretrained_netG``), ``main_test_vrt.py --model_path`` and the exporter read the file as
they read the ``.pth``."""

from __future__ import annotations

import copy
import json

import pytest
import torch

from engine import evaluate
from models.model_plain import ModelPlain
from models.network_baseline import VideoConvBaseline
from scripts import export
from tests.support.helpers import TINY_OPT
from utils import utils_checkpoint, utils_safetensors
from utils.utils_dist import DistInfo
from utils.utils_image import imwrite_rgb
from utils.utils_option import parse

NET = {"net_type": "videoconvbaseline", "upscale": 4, "num_feat": 8, "num_block": 1}


def _experiment(tmp_path):
    """A tiny baseline experiment with a G and an EMA checkpoint at step 5 that differ."""
    opt = copy.deepcopy(TINY_OPT)
    opt.update(netG=NET, val={"num_frame_testing": 2, "num_frame_overlapping": 1, "size_patch_testing": 0})
    opt["path"]["root"] = str(tmp_path / "experiments")
    (tmp_path / "opt.json").write_text(json.dumps(opt))
    models = tmp_path / "experiments" / "tiny" / "models"
    models.mkdir(parents=True)
    torch.manual_seed(0)
    g = VideoConvBaseline(upscale=4, num_feat=8, num_block=1).state_dict()
    e = {k: v + 0.5 for k, v in g.items()}
    torch.save({"params": g}, models / "5_G.pth")
    torch.save({"params_ema": e}, models / "5_E.pth")
    return str(tmp_path / "opt.json"), g, e


def test_round_trip_of_g_and_ema_with_the_options_in_the_metadata(tmp_path, capsys):
    opt, g, e = _experiment(tmp_path)
    for extra, want, key in (([], g, "params"), (["--ema"], e, "params_ema")):
        out = str(tmp_path / f"w{len(extra)}.safetensors")
        assert export.main(["--opt", opt, "--format", "safetensors", "--out", out, *extra]) == 0
        meta = utils_safetensors.read_metadata(out)
        assert json.loads(meta["netG"]) == NET and meta["param_key"] == key and meta["task"] == "tiny"
        net = VideoConvBaseline(upscale=4, num_feat=8, num_block=1)
        utils_checkpoint.load_network(net, out, strict=True)
        assert all(torch.equal(net.state_dict()[k], v) for k, v in want.items())
    # the exporter reads its own output as it reads a .pth: the same weights come out again
    again = str(tmp_path / "again.safetensors")
    assert export.main(["--opt", opt, "--model_path", str(tmp_path / "w1.safetensors"), "--format", "safetensors",
                        "--out", again]) == 0
    back = utils_safetensors.read_state_dict(again)
    assert back.keys() == e.keys() and all(torch.equal(back[k], e[k]) for k in e)
    # fp16 weights are stated in the metadata and load into the fp32 network (rounded)
    half = str(tmp_path / "half.safetensors")
    assert export.main(["--opt", opt, "--format", "safetensors", "--dtype", "fp16", "--out", half]) == 0
    assert utils_safetensors.read_metadata(half)["dtype"] == "fp16"
    assert all(v.dtype == torch.float16 for v in utils_safetensors.read_state_dict(half).values())
    assert "wrote" in capsys.readouterr().out


def test_training_loads_a_safetensors_pretrained_net(tmp_path):
    _, g, _ = _experiment(tmp_path)
    path = str(tmp_path / "g.safetensors")
    utils_safetensors.write_state_dict({f"module.{k}": v for k, v in g.items()}, path, {"netG": NET})
    base = {"task": "m", "model": "vrt", "scale": 4, "path": {"root": str(tmp_path), "pretrained_netG": path},
            "datasets": {}, "netG": NET, "train": {"G_lossfn_type": "l1", "G_optimizer_lr": 1e-2, "total_iter": 1}}
    model = ModelPlain(parse(None, base=base), DistInfo(0, 0, 1, torch.device("cpu")))
    model.init_train()
    model.load_pretrained()
    assert all(torch.equal(model.net_g.state_dict()[k], v) for k, v in g.items())


def test_evaluation_with_safetensors_equals_the_pth(tmp_path):
    opt, _, _ = _experiment(tmp_path)
    gen = torch.Generator().manual_seed(0)
    for t in range(3):
        imwrite_rgb(str(tmp_path / "gt" / "a" / f"{t:08d}.png"), torch.rand(3, 16, 12, generator=gen))
        imwrite_rgb(str(tmp_path / "lq" / "a" / f"{t:08d}.png"), torch.rand(3, 4, 3, generator=gen))
    weights = str(tmp_path / "g.safetensors")
    assert export.main(["--opt", opt, "--format", "safetensors", "--out", weights]) == 0
    common = ["--opt", opt, "--folder_lq", str(tmp_path / "lq"), "--folder_gt", str(tmp_path / "gt"), "--device",
              "cpu", "--num_workers", "0", "--save_result"]
    assert evaluate.main([*common, "--save_dir", str(tmp_path / "pth")]) == 0
    assert evaluate.main([*common, "--model_path", weights, "--save_dir", str(tmp_path / "st")]) == 0
    assert (tmp_path / "pth" / "metrics.csv").read_bytes() == (tmp_path / "st" / "metrics.csv").read_bytes()
    for t in range(3):
        name = f"{t:08d}.png"
        assert (tmp_path / "pth" / "a" / name).read_bytes() == (tmp_path / "st" / "a" / name).read_bytes()


def test_a_broken_safetensors_file_is_one_line(tmp_path):
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{not json")
    net = VideoConvBaseline(upscale=4, num_feat=8, num_block=1)
    with pytest.raises(utils_checkpoint.CheckpointError, match="cannot read .*bad.safetensors as safetensors") as err:
        utils_checkpoint.load_network(net, str(bad))
    assert "\n" not in str(err.value)
