"""Environment parsing for torchrun, SLURM and the legacy --local_rank argument (no processes started)."""

from __future__ import annotations

import pytest
import torch

from utils import utils_dist
from utils.utils_dist import DistError, first_slurm_host, world_info_from_env


def test_torchrun_env():
    assert world_info_from_env({"RANK": "5", "LOCAL_RANK": "1", "WORLD_SIZE": "8"}) == (5, 1, 8)


def test_single_process_defaults():
    assert world_info_from_env({}) == (0, 0, 1)


def test_slurm_fallback():
    env = {"SLURM_PROCID": "3", "SLURM_LOCALID": "1", "SLURM_NTASKS": "4", "SLURM_NODELIST": "gpu[07-08]"}
    assert world_info_from_env(env) == (3, 1, 4)


def test_torchrun_wins_over_slurm():
    env = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "2", "SLURM_PROCID": "3", "SLURM_NTASKS": "4"}
    assert world_info_from_env(env) == (0, 0, 2)


def test_slurm_rendezvous_variables():
    env = {"SLURM_PROCID": "2", "SLURM_LOCALID": "0", "SLURM_NTASKS": "4", "SLURM_JOB_NODELIST": "node[3-4,9]"}
    utils_dist._fill_slurm_rendezvous(env)
    assert env["MASTER_ADDR"] == "node3" and env["RANK"] == "2" and env["WORLD_SIZE"] == "4"


@pytest.mark.parametrize("nodelist,host", [("gpu01", "gpu01"), ("gpu[01-04,07]", "gpu01"),
                                           ("a[9],b[1-2]", "a9"), ("cpu3,gpu[2-3]", "cpu3")])
def test_first_slurm_host(nodelist, host):
    assert first_slurm_host(nodelist) == host


def test_legacy_local_rank_fills_only_when_missing():
    env: dict[str, str] = {}
    utils_dist.apply_legacy_local_rank(3, env)
    assert env["LOCAL_RANK"] == "3"
    env = {"LOCAL_RANK": "1"}
    utils_dist.apply_legacy_local_rank(3, env)
    assert env["LOCAL_RANK"] == "1"


def test_invalid_rank_is_clear():
    with pytest.raises(DistError, match="RANK=4, WORLD_SIZE=2"):
        world_info_from_env({"RANK": "4", "WORLD_SIZE": "2"})
    with pytest.raises(DistError, match="WORLD_SIZE='two'"):
        world_info_from_env({"WORLD_SIZE": "two"})


def test_local_rank_beyond_visible_gpus(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5")
    with pytest.raises(DistError, match=r"LOCAL_RANK=2 but only 2 GPU\(s\) are visible \(CUDA_VISIBLE_DEVICES=4,5\)"):
        utils_dist.select_device(2)
    assert utils_dist.select_device(1) == torch.device("cuda", 1)


def test_cpu_device_without_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert utils_dist.select_device(0) == torch.device("cpu")


def test_helpers_without_process_group():
    assert utils_dist.broadcast_object({"a": 1}) == {"a": 1}
    assert list(utils_dist.reduce_mean_dict({"b": 2.0, "a": 1}).items()) == [("b", 2.0), ("a", 1.0)]
    assert utils_dist.all_reduce_max_int(7) == 7
    calls = []
    assert utils_dist.master_only(lambda: calls.append(1) or "x")() == "x"
    assert calls == [1]
