"""Option parsing: KAIR files load unchanged, comments are string-aware, errors name key/type/position."""

from __future__ import annotations

import glob
import json
import os

import pytest

from utils import utils_option
from utils.utils_option import OptionError, parse, strip_json_comments

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

MINIMAL = """// a KAIR-style file
{
  "task": "t1"   // trailing comment
  , "model": "vrt"
  , "gpu_ids": [0,1,2,3,4,5,6,7]
  , "dist": true
  , "scale": 4
  , "n_channels": 3
  , "path": {"root": "~/exp", "pretrained_netG": null}
  , "datasets": {"train": {"dataset_type": "X", "dataroot_gt": "~/trainsets/REDS", "note": "http://a.b//c"},
                 "test": {"dataset_type": "Y", "dataroot_lq": "~/testsets/x"}}
  , "netG": {"net_type": "vrt", "upscale": 4}
  , "train": {"G_optimizer_lr": 4e-4, "total_iter": 100, "E_param_strict": false}
  , "val": {"save_img": false}
}
"""


@pytest.fixture
def opt_file(tmp_path):
    path = tmp_path / "opt.json"
    path.write_text(MINIMAL)
    return str(path)


def test_comment_stripping_is_string_aware():
    text = '{"url": "http://x.org//y", "a": 1} // comment with "quotes"\n'
    assert json.loads(strip_json_comments(text)) == {"url": "http://x.org//y", "a": 1}
    assert json.loads(strip_json_comments('{"s": "a\\"//b"} // c')) == {"s": 'a"//b'}


def test_parse_minimal_defaults_and_paths(opt_file, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    opt = parse(opt_file)
    home = os.path.expanduser("~")
    assert opt["datasets"]["train"]["note"] == "http://a.b//c"
    assert opt["datasets"]["train"]["dataroot_gt"] == os.path.join(home, "trainsets/REDS")
    assert opt["datasets"]["test"]["dataroot_lq"] == os.path.join(home, "testsets/x")
    assert opt["path"]["task"] == os.path.join(home, "exp", "t1")
    assert opt["path"]["models"] == os.path.join(home, "exp", "t1", "models")
    assert opt["num_gpu"] == 2  # WORLD_SIZE, not len(gpu_ids)
    assert opt["datasets"]["train"]["scale"] == 4 and opt["datasets"]["train"]["phase"] == "train"
    assert opt["train"]["E_param_strict"] is False  # KAIR forced this to True
    assert opt["train"]["G_optimizer_betas"] == [0.9, 0.999]
    assert opt["train"]["G_scheduler_periods"] == 100
    assert "CUDA_VISIBLE_DEVICES" not in os.environ
    assert "scale" not in opt["netG"]  # netG keys go to the constructor untouched


def test_misspelt_key_suggests_closest(opt_file, tmp_path):
    data = json.loads(strip_json_comments(open(opt_file).read()))
    data["train"]["G_optimiser_lr"] = 1e-3
    with pytest.raises(OptionError, match=r"train\.G_optimiser_lr.*did you mean 'G_optimizer_lr'"):
        parse(None, base=data)
    data = json.loads(strip_json_comments(open(opt_file).read()))
    data["scael"] = 2
    with pytest.raises(OptionError, match=r"unknown option 'scael'; did you mean 'scale'"):
        parse(None, base=data)


def test_wrong_type_names_expected(opt_file):
    with pytest.raises(OptionError, match=r"'train\.total_iter' must be integer, got str"):
        parse(opt_file, ["train.total_iter=\"many\""])
    with pytest.raises(OptionError, match=r"'train\.total_iter' must be integer, got bool"):
        parse(opt_file, ["train.total_iter=true"])
    with pytest.raises(OptionError, match=r"'train\.amp' = 'fp8' is not one of"):
        parse(opt_file, ["train.amp=fp8"])


def test_malformed_json_names_file_line_column(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{\n  "task": "x",\n  "scale": 4,,\n}\n')
    with pytest.raises(OptionError, match=r"bad\.json:3:14: malformed JSON"):
        parse(str(bad))


def test_set_overrides_nested_keys(opt_file):
    opt = parse(opt_file, ["train.total_iter=10", "datasets.train.dataloader_batch_size=2", "task=other",
                           "netG.embed_dims=[8,8]"])
    assert opt["train"]["total_iter"] == 10
    assert opt["datasets"]["train"]["dataloader_batch_size"] == 2
    assert opt["task"] == "other" and opt["path"]["task"].endswith("other")
    assert opt["netG"]["embed_dims"] == [8, 8]
    with pytest.raises(OptionError, match="KEY=VALUE"):
        parse(opt_file, ["train.total_iter"])


def test_parse_does_not_mutate_base():
    base = {"task": "a", "path": {"root": "r"}, "datasets": {"train": {"dataset_type": "x"}},
            "netG": {"net_type": "vrt"}, "train": {}}
    snapshot = json.dumps(base, sort_keys=True)
    parse(None, base=base)
    assert json.dumps(base, sort_keys=True) == snapshot


@pytest.mark.parametrize("path", sorted(glob.glob(os.path.join(ROOT, "options", "*", "*.json"))))
def test_every_shipped_option_file_parses(path):
    opt = parse(path)
    assert opt["netG"]["net_type"]
    assert opt["train"]["total_iter"] > 0


def test_save_writes_resolved_copy(opt_file, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    opt = parse(opt_file, ["path.root=exp"])
    dest = utils_option.save(opt, ["main_train_vrt.py", "--opt", opt_file])
    saved = json.load(open(dest))
    assert saved["train"]["total_iter"] == 100 and "main_train_vrt.py" in saved["command_line"]
    reparsed = parse(dest)  # a saved copy is itself a valid option file
    assert reparsed["train"] == opt["train"]
