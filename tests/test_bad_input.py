"""Bad input: one clear error line naming what is wrong and what would be valid, a non-zero exit, and an existing
experiment left untouched. Runs main() in-process (single CPU process) to stay fast."""

from __future__ import annotations

import json
import os

import pytest
import torch

import main_train_vrt
from tests.support.helpers import write_opt


def _snapshot(folder):
    out = {}
    for dirpath, _, files in os.walk(folder):
        for name in files:
            path = os.path.join(dirpath, name)
            out[os.path.relpath(path, folder)] = (os.path.getsize(path), os.path.getmtime(path))
    return out


@pytest.fixture(scope="module")
def experiment(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bad")
    opt = write_opt(tmp, train={"total_iter": 2, "checkpoint_save": 2})
    cwd = os.getcwd()
    os.chdir(tmp)
    try:
        assert main_train_vrt.main(["--opt", opt]) == 0
    finally:
        os.chdir(cwd)
    return tmp, opt


def _run(capsys, tmp, args, monkeypatch, env=None):
    for key in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
        monkeypatch.delenv(key, raising=False)
    for key, value in (env or {}).items():
        monkeypatch.setenv(key, value)
    before = _snapshot(tmp / "experiments")
    monkeypatch.chdir(tmp)
    capsys.readouterr()
    code = main_train_vrt.main(args)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1
    assert len(err) == 1 and err[0].startswith("error: "), err
    assert _snapshot(tmp / "experiments") == before  # nothing the user had was touched
    return err[0]


def test_malformed_json(experiment, capsys, monkeypatch):
    tmp, _ = experiment
    bad = tmp / "broken.json"
    bad.write_text('{\n "task": "tiny",\n "scale": 4\n "model": "vrt"\n}\n')
    line = _run(capsys, tmp, ["--opt", str(bad)], monkeypatch)
    assert "broken.json:4:2: malformed JSON" in line


def test_misspelt_key(experiment, capsys, monkeypatch):
    tmp, opt = experiment
    line = _run(capsys, tmp, ["--opt", opt, "--set", "train.checkpoint_sav=3"], monkeypatch)
    assert "unknown option 'train.checkpoint_sav'; did you mean 'checkpoint_save'?" in line


def test_wrong_type(experiment, capsys, monkeypatch):
    tmp, opt = experiment
    line = _run(capsys, tmp, ["--opt", opt, "--set", "train.G_optimizer_lr=\"fast\""], monkeypatch)
    assert "'train.G_optimizer_lr' must be integer or number, got str" in line


def test_missing_data_root(experiment, capsys, monkeypatch):
    tmp, opt = experiment
    with open(opt) as f:
        data = json.load(f)
    data["datasets"]["train"] = {  # a whole section: the synthetic set's keys are not keys of this dataset type
        "dataset_type": "VideoRecurrentTrainDataset", "dataroot_gt": f"{tmp}/nowhere/GT",
        "dataroot_lq": f"{tmp}/nowhere/LQ", "meta_info_file": f"{tmp}/nowhere/meta.txt", "num_frame": 2}
    (tmp / "real_data.json").write_text(json.dumps(data))
    line = _run(capsys, tmp, ["--opt", str(tmp / "real_data.json")], monkeypatch)
    assert "nowhere" in line


def test_batch_that_does_not_divide(experiment, capsys, monkeypatch):
    tmp, opt = experiment
    line = _run(capsys, tmp, ["--opt", opt, "--set", "datasets.train.dataloader_batch_size=3",
                              "train.grad_accum_steps=2"], monkeypatch)
    assert "dataloader_batch_size=3 does not divide over 1 process(es) x 2 accumulation step(s)" in line
    assert "one of [2, 4, 6, 8]" in line


def test_local_rank_beyond_visible_gpus(experiment, capsys, monkeypatch):
    tmp, opt = experiment
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    line = _run(capsys, tmp, ["--opt", opt, "--local_rank", "3"], monkeypatch)
    assert "LOCAL_RANK=3 but only 1 GPU(s) are visible" in line


def test_missing_pretrained(experiment, capsys, monkeypatch):
    tmp, opt = experiment
    line = _run(capsys, tmp, ["--opt", opt, "--set", "task=fresh", "path.pretrained_netG=model_zoo/none.pth"],
                monkeypatch)
    assert "path.pretrained_netG = 'model_zoo/none.pth' does not exist" in line


def test_checkpoint_of_another_architecture(experiment, capsys, monkeypatch):
    tmp, opt = experiment
    other = tmp / "other.pth"
    torch.save({"params": {"conv_first.weight": torch.zeros(4, 3, 3, 3), "head.bias": torch.zeros(3)}}, other)
    line = _run(capsys, tmp, ["--opt", opt, "--set", "task=fresh2", f"path.pretrained_netG={other}"], monkeypatch)
    assert "does not fit the network (VideoConvBaseline)" in line and "missing" in line and "unexpected 1" in line
    assert len(line) < 800  # a summary, not a wall of text


def test_total_iter_below_saved_step(experiment, capsys, monkeypatch):
    tmp, opt = experiment
    line = _run(capsys, tmp, ["--opt", opt, "--set", "train.total_iter=1"], monkeypatch)
    assert "holds a complete checkpoint at step 2 but train.total_iter=1; set train.total_iter above 2" in line


def test_non_finite_loss_keeps_last_checkpoint(experiment, capsys, monkeypatch):
    tmp, opt = experiment
    models = tmp / "experiments" / "tiny" / "models"
    before = _snapshot(models)
    monkeypatch.chdir(tmp)
    capsys.readouterr()
    code = main_train_vrt.main(["--opt", opt, "--set", "train.total_iter=6", "train.G_optimizer_lr=1e30",
                                "train.G_optimizer_betas=[0.0, 0.0]"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and len(err) == 1
    assert "non-finite loss" in err[0] and "the last complete checkpoint is step 2" in err[0]
    assert _snapshot(models) == before


def test_saved_options_reload(experiment):
    tmp, _ = experiment
    folder = tmp / "experiments" / "tiny" / "options"
    saved = [json.load(open(folder / f)) for f in os.listdir(folder) if f.endswith(".json")]
    assert any(data["train"]["total_iter"] == 2 for data in saved)  # the successful run's resolved options
