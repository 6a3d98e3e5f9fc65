"""Checkpoint files: atomic writes, complete-step detection, safe loading, name-matched loading, RNG state."""

from __future__ import annotations

import os
import pickle
import random

import numpy as np
import pytest
import torch
from torch import nn

from utils import utils_checkpoint as ckpt
from utils.utils_checkpoint import CheckpointError


def _touch(path):
    torch.save({"params": {}}, path)


def test_latest_complete_step_needs_state_file(tmp_path):
    for step in (100, 200, 300):
        _touch(tmp_path / f"{step}_G.pth")
    _touch(tmp_path / "100_state.pth")
    _touch(tmp_path / "200_state.pth")
    (tmp_path / "400_state.pth.tmp123").write_bytes(b"partial")
    assert ckpt.complete_steps(str(tmp_path)) == [100, 200]
    assert ckpt.latest_complete_step(str(tmp_path)) == 200
    assert ckpt.latest_complete_step(str(tmp_path / "missing")) == 0


def test_atomic_save_fsyncs_the_file_and_then_its_folder_after_the_rename(tmp_path, monkeypatch):
    events = []
    real_fsync, real_replace = os.fsync, os.replace
    monkeypatch.setattr(os, "fsync", lambda fd: events.append(("fsync", os.path.realpath(f"/proc/self/fd/{fd}")))
                        or real_fsync(fd))
    monkeypatch.setattr(os, "replace", lambda a, b: events.append(("replace", b)) or real_replace(a, b))
    path = str(tmp_path / "5_G.pth")
    ckpt.atomic_save({"params": {"w": torch.ones(2)}}, path)
    kinds = [kind for kind, _ in events]
    assert kinds == ["fsync", "replace", "fsync"], events
    assert events[0][1].startswith(path + ".tmp")  # the data, before the rename
    assert events[2][1] == os.path.realpath(str(tmp_path))  # the folder holding the rename, after it


def test_atomic_save_leaves_no_temp_and_keeps_old_file_on_failure(tmp_path):
    path = str(tmp_path / "1_G.pth")
    ckpt.atomic_save({"params": {"w": torch.ones(2)}}, path)
    assert os.listdir(tmp_path) == ["1_G.pth"]

    class Boom:
        def __reduce__(self):
            raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        ckpt.atomic_save({"x": Boom()}, path)
    assert os.listdir(tmp_path) == ["1_G.pth"]
    assert torch.equal(ckpt.safe_load(path)["params"]["w"], torch.ones(2))


class _Payload:
    def __reduce__(self):
        return (os.system, ("touch PWNED",))


def test_pickled_payload_is_refused_and_never_runs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    evil = tmp_path / "evil.pth"
    with open(evil, "wb") as f:
        torch.save({"params": {"w": torch.zeros(1)}, "extra": _Payload()}, f, pickle_module=pickle)
    with pytest.raises(CheckpointError, match=r"refused to load .*evil\.pth"):
        ckpt.safe_load(str(evil))
    assert not (tmp_path / "PWNED").exists()


def test_truncated_file_is_a_clear_error(tmp_path):
    path = tmp_path / "5_G.pth"
    ckpt.atomic_save({"params": {"w": torch.ones(100)}}, str(path))
    path.write_bytes(path.read_bytes()[:50])
    with pytest.raises(CheckpointError, match="5_G.pth"):
        ckpt.safe_load(str(path))


def test_load_network_strips_prefixes_and_reports_mismatch(tmp_path):
    net = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 2))
    sd = {f"module._orig_mod.{k}": v + 1 for k, v in net.state_dict().items()}
    path = str(tmp_path / "w.pth")
    torch.save({"params": sd}, path)
    other = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 2))
    ckpt.load_network(other, path, strict=True)
    assert torch.equal(other[0].weight, net[0].weight + 1)

    wrong = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 5), nn.Linear(5, 1))
    with pytest.raises(CheckpointError, match=r"missing 2 \(2\.weight, 2\.bias\); shape-mismatched 2"):
        ckpt.load_network(wrong, path, strict=True)
    before = wrong[1].weight.clone()
    ckpt.load_network(wrong, path, strict=False)  # loads only the matching tensors, by name
    assert torch.equal(wrong[0].weight, net[0].weight + 1)
    assert torch.equal(wrong[1].weight, before)


def test_rng_state_round_trip_under_weights_only(tmp_path):
    random.seed(1)
    np.random.seed(2)
    torch.manual_seed(3)
    state = ckpt.capture_rng_state()
    expected = (random.random(), np.random.rand(), torch.rand(1).item())
    path = str(tmp_path / "s.pth")
    ckpt.atomic_save({"rng": [state]}, path)
    loaded = ckpt.safe_load(path)["rng"][0]
    random.seed(9)
    np.random.seed(9)
    torch.manual_seed(9)
    ckpt.restore_rng_state(loaded)
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == expected
