"""Experiment trackers, offline: W&B (``mode: offline``) and MLflow (a ``file://`` store) receive the scalars and
validation numbers that TensorBoard gets, from rank 0 only (a real 2-process torchrun launch); a resumed run continues
the same tracker runs through the ids kept in the checkpoint state; a missing package is one line before anything is
built; the ``logger`` section is checked strictly; starting a tracker leaves the random streams as they were."""

from __future__ import annotations

import glob
import json
import os
import random
import struct
import sys
import types

import pytest
import torch

import main_train_vrt
from tests.support.helpers import assert_ok, base_env, models_dir, single, torchrun, write_opt
from utils import utils_option, utils_trackers

LOGGER = {"wandb": {"project": "vrt-tests", "mode": "offline"}, "mlflow": {"experiment": "vrt-tests"}}
# first run: steps 1-2 with a validation at 2; the resume runs steps 3-4 with a validation at 4
TRAIN = {"total_iter": 2, "checkpoint_test": 2, "checkpoint_save": 2, "checkpoint_print": 1}
# KAIR's four and tOF (lower is better, no weights to fetch), which picks the best step
VAL = {"metrics": ["psnr", "ssim", "psnr_y", "ssim_y", "tof"], "best_metric": "tof"}


def _env(tmp_path) -> dict[str, str]:
    """Offline, quiet, nothing outside ``tmp_path`` (W&B's run files go to the experiment folder, its default)."""
    env = base_env(WANDB_MODE="offline", WANDB_SILENT="true", WANDB_ERROR_REPORTING="false", WANDB_DISABLE_GIT="true",
                   WANDB_CONFIG_DIR=str(tmp_path / "wandb-config"), WANDB_CACHE_DIR=str(tmp_path / "wandb-cache"),
                   WANDB_DATA_DIR=str(tmp_path / "wandb-data"), MLFLOW_ALLOW_FILE_STORE="true")
    for key in ("WANDB_DIR", "WANDB_API_KEY", "WANDB_PROJECT", "WANDB_ENTITY", "MLFLOW_TRACKING_URI",
                "MLFLOW_EXPERIMENT_NAME"):
        env.pop(key, None)
    return env


def _tensorboard(folder: str) -> dict[str, dict[int, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out: dict[str, dict[int, float]] = {}
    for path in sorted(glob.glob(os.path.join(folder, "events.out.tfevents.*"))):
        events = EventAccumulator(path)
        events.Reload()
        for tag in events.Tags()["scalars"]:
            out.setdefault(tag, {}).update({e.step: e.value for e in events.Scalars(tag)})
    return out


def _wandb_records(path: str) -> list:
    """The protobuf records of an offline W&B run file (``run-<id>.wandb``): a 7-byte header (``:W&B``, magic,
    version), then records in 32 KiB blocks, each chunk behind a 7-byte header (CRC-32, length, type: full, first,
    middle, last)."""
    from wandb.proto import wandb_internal_pb2

    data = open(path, "rb").read()
    assert data[:4] == b":W&B", path
    pos, pending, records = 7, b"", []
    while pos + 7 <= len(data):
        if 32768 - pos % 32768 < 7:  # a block's tail too short for a chunk header is padding
            pos += 32768 - pos % 32768
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        pending += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
            pending = b""
    return records


def _wandb_runs(folder: str) -> list[dict]:
    """Per offline run folder: its run id, logged history ``{name: {step: value}}`` and config keys."""
    runs = []
    for run_dir in sorted(glob.glob(os.path.join(folder, "offline-run-*"))):
        (path,) = glob.glob(os.path.join(run_dir, "run-*.wandb"))
        run: dict = {"id": None, "history": {}, "config": {}, "images": {}}
        for record in _wandb_records(path):
            kind = record.WhichOneof("record_type")
            if kind == "run":
                run["id"] = record.run.run_id
            elif kind == "history":
                items = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.history.item
                         if len(i.nested_key) < 2}
                step = items.pop("_step")
                for key, value in items.items():
                    if not key.startswith("_"):
                        run["history"].setdefault(key, {})[step] = value
                for i in record.history.item:  # a logged image: its fields under (name, field)
                    if len(i.nested_key) == 2:
                        name, part = i.nested_key
                        run["images"].setdefault(name, {}).setdefault(step, {})[part] = json.loads(i.value_json)
            elif kind == "config":
                run["config"].update({i.key: json.loads(i.value_json) for i in record.config.update})
        runs.append(run)
    return runs


def _same_numbers(logged: dict[str, dict[int, float]], tb: dict[str, dict[int, float]], who: str) -> None:
    assert logged.keys() == tb.keys(), who
    for tag, values in tb.items():
        assert logged[tag].keys() == values.keys(), (who, tag)
        for step, value in values.items():  # TensorBoard keeps float32
            assert logged[tag][step] == pytest.approx(value, rel=1e-6, abs=1e-12), (who, tag, step)


def test_trackers_get_the_tensorboard_numbers_from_rank_0_and_a_resume_continues_their_runs(tmp_path, monkeypatch):
    # the optional trackers extra (requirements-dev.txt installs it)
    pytest.importorskip("wandb")
    MlflowClient = pytest.importorskip("mlflow").MlflowClient  # noqa: N806

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # the test reads the store MLflow 3 keeps for back-compat

    uri = (tmp_path / "mlruns").as_uri()
    opt = write_opt(tmp_path, logger={**LOGGER, "mlflow": {**LOGGER["mlflow"], "tracking_uri": uri}}, train=TRAIN,
                    val=VAL)
    env = _env(tmp_path)
    assert_ok(torchrun(2, ["--opt", opt], env, str(tmp_path)))
    ids = torch.load(os.path.join(models_dir(tmp_path, "tiny"), "2_state.pth"), weights_only=True)["trackers"]
    assert set(ids) == {"wandb", "mlflow"}
    resumed = single(["--opt", opt, "--set", "train.total_iter=4"], env, str(tmp_path))
    assert_ok(resumed)
    assert "Resuming from step 2" in resumed.stdout
    for key in ("wandb", "mlflow"):
        assert f"Tracker {key}: run {ids[key]} (the checkpoint's, continued)" in resumed.stdout
    assert torch.load(os.path.join(models_dir(tmp_path, "tiny"), "4_state.pth"), weights_only=True)["trackers"] == ids

    tb = _tensorboard(os.path.join(tmp_path, "experiments", "tiny", "tensorboard"))
    assert sorted(tb["train/G_loss"]) == [1, 2, 3, 4] and sorted(tb["val/PSNR"]) == [2, 4]
    assert {"train/lr", "train/samples_s", "val/SSIM", "val/psnr_y", "val/ssim_y", "val/TOF"} <= tb.keys()
    # the best step by tOF (lower is better) over both launches, kept through the resume, in models/best.json
    best = json.load(open(os.path.join(models_dir(tmp_path, "tiny"), "best.json")))
    tof = tb["val/TOF"]
    assert (best["metric"], best["step"]) == ("tof", min(tof, key=tof.get))
    assert best["value"] == pytest.approx(tof[best["step"]], rel=1e-6)
    psnr = tb["val/PSNR"]
    assert best["metrics"]["test/psnr"]["step"] == max(psnr, key=psnr.get)  # each metric in its own direction

    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("vrt-tests")
    (run,) = client.search_runs([experiment.experiment_id])  # one run: rank 1 opened none, the resume reopened it
    assert run.info.run_id == ids["mlflow"] and run.info.run_name == "tiny" and run.info.status == "FINISHED"
    history = {tag: {m.step: m.value for m in client.get_metric_history(run.info.run_id, tag)} for tag in tb}
    assert all(len(client.get_metric_history(run.info.run_id, tag)) == len(tb[tag]) for tag in tb)  # once each
    _same_numbers(history, tb, "mlflow")
    assert run.data.params["train.total_iter"] == "2" and run.data.params["netG.net_type"] == "videoconvbaseline"
    images = [a.path for a in client.list_artifacts(run.info.run_id, "images")]
    assert len([p for p in images if "val_lq_output_gt" in p and p.endswith(".png")]) == 2, images  # steps 2, 4

    runs = _wandb_runs(os.path.join(tmp_path, "experiments", "tiny", "wandb"))
    assert [r["id"] for r in runs] == [ids["wandb"], ids["wandb"]]  # one per launch (rank 0), the same run
    merged: dict[str, dict[int, float]] = {}
    for r in runs:
        for tag, values in r["history"].items():
            assert not set(values) & set(merged.get(tag, {})), tag
            merged.setdefault(tag, {}).update(values)
    assert sorted(runs[0]["history"]["train/G_loss"]) == [1, 2] and sorted(runs[1]["history"]["train/G_loss"]) == [3, 4]
    strips = [r["images"]["val/lq_output_gt"] for r in runs]  # the validation strip: input | output | GT
    assert [sorted(s) for s in strips] == [[2], [4]]
    assert all(v["_type"] == "image-file" and (v["width"], v["height"]) == (3 * 64, 64) for s in strips
               for v in s.values())
    _same_numbers(merged, tb, "wandb")
    assert runs[0]["config"]["train"]["total_iter"] == 2 and runs[1]["config"]["train"]["total_iter"] == 4
    assert runs[0]["config"]["logger"]["wandb"]["mode"] == "offline"


@pytest.mark.parametrize("package", ["wandb", "mlflow"])
def test_a_missing_tracker_package_is_one_line_before_anything_is_built(tmp_path, monkeypatch, capsys, package):
    opt = write_opt(tmp_path, logger={package: {}}, train=TRAIN)
    monkeypatch.setitem(sys.modules, package, None)  # what `import <package>` meets when it is not installed
    for key in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.chdir(tmp_path)
    capsys.readouterr()
    assert main_train_vrt.main(["--opt", opt]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"error: logger.{package} needs the '{package}' package: pip install {package} "
                   "(or pip install .[trackers])"]
    assert not os.path.exists(tmp_path / "experiments")


@pytest.mark.parametrize("section, message", [
    ({"wandb": {"projct": "x"}}, "unknown option 'logger.wandb.projct'; did you mean 'project'?"),
    ({"mlflow": {"tracking_url": "file:///x"}}, "unknown option 'logger.mlflow.tracking_url'; did you mean "
                                                "'tracking_uri'?"),
    ({"tensorboard": {}}, "unknown option 'logger.tensorboard'; known keys here: mlflow, wandb"),
    ({"wandb": {"mode": "shared"}}, "option 'logger.wandb.mode' = 'shared' is not one of None, 'online', "
                                    "'offline', 'disabled'"),
])
def test_the_logger_section_is_checked_strictly(tmp_path, section, message):
    with pytest.raises(utils_option.OptionError) as info:
        utils_option.parse(write_opt(tmp_path, logger=section))
    assert str(info.value) == message


def test_resume_id_wins_and_starting_leaves_the_random_streams_alone(tmp_path, monkeypatch):
    """``logger.wandb.resume_id`` overrides the checkpoint's id; a tracker library that draws from the global
    generators while it starts does not shift the training's random streams."""
    calls = []

    class FakeRun:
        id = "from-options"
        config = types.SimpleNamespace(update=lambda values, allow_val_change: calls.append(("config", values)))

    def init(**kwargs):
        calls.append(("init", kwargs))
        random.random(), torch.rand(3)  # e.g. a run id drawn from the global generators
        return FakeRun()

    monkeypatch.setitem(sys.modules, "wandb", types.SimpleNamespace(init=init))
    opt = utils_option.parse(write_opt(tmp_path, logger={"wandb": {"resume_id": "from-options"}}))
    trackers = utils_trackers.create_trackers(opt)
    before = (random.getstate(), torch.get_rng_state())
    ids = utils_trackers.start_trackers(trackers, {"wandb": "from-checkpoint", "mlflow": "kept"}, opt)
    assert ids == {"wandb": "from-options", "mlflow": "kept"}
    assert random.getstate() == before[0] and torch.equal(torch.get_rng_state(), before[1])
    (_, kwargs), (_, config) = calls
    assert kwargs["id"] == "from-options" and kwargs["resume"] == "allow" and kwargs["name"] == "tiny"
    assert kwargs["dir"] == opt["path"]["task"] and config["train"]["total_iter"] == 3
