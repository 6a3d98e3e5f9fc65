"""Environment parsing for torchrun, SLURM and the legacy --local_rank argument; the per-attempt store."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import pytest
import torch
from torch.distributed import TCPStore

from tests.support.helpers import ROOT, base_env
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


def _gpus(monkeypatch, count):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)


def test_an_srun_task_bound_to_one_gpu_uses_it(monkeypatch):
    """srun --gpus-per-task=1: each task sees one GPU (CUDA_VISIBLE_DEVICES holds one id) whatever its SLURM_LOCALID;
    torchrun's rule, LOCAL_RANK among the visible GPUs, is unchanged."""
    _gpus(monkeypatch, 1)
    task = {"SLURM_LOCALID": "3", "CUDA_VISIBLE_DEVICES": "3"}
    assert utils_dist.select_device(3, env=task) == torch.device("cuda", 0)
    assert utils_dist.select_device(0, env=task) == torch.device("cuda", 0)
    assert utils_dist.select_device(3, "cpu", env=task) == torch.device("cpu")
    worker = {"LOCAL_WORLD_SIZE": "2", "CUDA_VISIBLE_DEVICES": "0"}  # two torchrun workers, one GPU: an error
    with pytest.raises(DistError, match=r"LOCAL_RANK=1 but only 1 GPU\(s\) .*torchrun --nproc_per_node=1"):
        utils_dist.select_device(1, env=worker)
    with pytest.raises(DistError, match="torchrun"):  # srun starting torchrun: its workers follow torchrun's rule
        utils_dist.select_device(1, env={**worker, "SLURM_LOCALID": "0"})
    _gpus(monkeypatch, 4)  # tasks that see every GPU of the node pick theirs by local rank
    assert utils_dist.select_device(3, env={"SLURM_LOCALID": "3"}) == torch.device("cuda", 3)
    _gpus(monkeypatch, 2)  # two GPUs per task, local id 3: not a binding we can read
    with pytest.raises(DistError, match=r"srun --gpus-per-task=1"):
        utils_dist.select_device(3, env={"SLURM_LOCALID": "3", "CUDA_VISIBLE_DEVICES": "6,7"})


def test_slurm_task_on_a_compressed_node_list_bound_to_one_gpu(monkeypatch):
    """The whole path of an srun task: SLURM's variables -> rank, local rank, world size, MASTER_ADDR, its GPU."""
    for key in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_WORLD_SIZE"):
        monkeypatch.setenv(key, "")  # recorded, so that what _fill_slurm_rendezvous writes is undone afterwards
        monkeypatch.delenv(key)
    slurm = {"SLURM_PROCID": "5", "SLURM_LOCALID": "1", "SLURM_NTASKS": "8", "SLURM_NODEID": "2",
             "SLURM_JOB_NODELIST": "node[01-04]", "CUDA_VISIBLE_DEVICES": "1", "VRT_DEVICE": ""}
    for key, value in slurm.items():
        monkeypatch.setenv(key, value)
    utils_dist._fill_slurm_rendezvous(os.environ)
    assert (os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"]) == ("node01", "29500")
    _gpus(monkeypatch, 1)
    assert utils_dist.get_dist_info() == (5, 1, 8, torch.device("cuda", 0))


def test_kubeflow_one_process_per_pod():
    """A PyTorchJob pod running the script itself: the operator's MASTER_ADDR/MASTER_PORT/WORLD_SIZE/RANK, no
    LOCAL_RANK (one GPU per pod)."""
    env = {"MASTER_ADDR": "vrt-reds-master-0", "MASTER_PORT": "23456", "WORLD_SIZE": "4", "RANK": "3",
           "PYTHONUNBUFFERED": "0"}
    assert world_info_from_env(env) == (3, 0, 4)


def test_own_address_is_the_route_to_the_peer():
    assert utils_dist.own_address("127.0.0.1", 29500) == "127.0.0.1"
    assert utils_dist.own_address("no-such-host.invalid", 29500)  # falls back to the host name


def test_the_attempt_store_key_belongs_to_the_job():
    assert utils_dist.attempt_store_key({"TORCHELASTIC_RUN_ID": "job7"}) == "vrt/attempt_store/job7"
    assert utils_dist.attempt_store_key({}) != utils_dist.attempt_store_key({"TORCHELASTIC_RUN_ID": "job7"})


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


def _attempt(agent_port: int, restart: int, delays: tuple[float, float]) -> list[str]:
    """Start two ranks as torchrun's agent would (sharing its store), with start delays; return their outputs."""
    procs = []
    for rank, delay in enumerate(delays):
        env = base_env(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                       MASTER_PORT=str(agent_port), TORCHELASTIC_USE_AGENT_STORE="True",
                       TORCHELASTIC_RESTART_COUNT=str(restart), TEST_START_DELAY=str(delay), TEST_TIMEOUT="30")
        worker = os.path.join(ROOT, "tests", "support", "attempt_worker.py")
        procs.append(subprocess.Popen([sys.executable, worker], env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    try:
        return [p.communicate(timeout=60)[0] for p in procs]
    finally:
        for p in procs:
            p.kill()


def test_a_restarted_attempt_ignores_the_dead_attempts_keys():
    """torchrun keeps its store across --max-restarts attempts; after an attempt dies without tearing down, a
    restarted rank 1 that starts before rank 0 would read rank 0's dead gloo address from a shared store and hang
    until the timeout (pytorch/pytorch#135712). With a store per attempt it connects as soon as rank 0 is up."""
    agent = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    first = _attempt(agent.port, 0, (0.0, 0.0))
    assert [out.strip().splitlines()[-1] for out in first] == ["rank 0 sum 3", "rank 1 sum 3"], first
    second = _attempt(agent.port, 1, (3.0, 0.0))  # rank 0 comes up 3 s after rank 1
    assert [out.strip().splitlines()[-1] for out in second] == ["rank 0 sum 3", "rank 1 sum 3"], second


def test_attempt_store_skips_an_entry_whose_store_is_not_this_attempts(monkeypatch):
    """A stale entry may point at a live store (its port reused): the nonce check rejects it."""
    agent = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    foreign = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    foreign.set("nonce", "aaaa")
    agent.set(utils_dist.attempt_store_key(), f"127.0.0.1:{foreign.port}:bbbb")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(agent.port))
    cpu = torch.device("cpu")
    found = {}
    waiter = threading.Thread(target=lambda: found.update(
        store=utils_dist._attempt_store(utils_dist.DistInfo(1, 1, 2, cpu), 30)))
    waiter.start()
    time.sleep(1.5)  # rank 1 is polling the stale entry
    assert waiter.is_alive()
    ours = utils_dist._attempt_store(utils_dist.DistInfo(0, 0, 2, cpu), 30)
    waiter.join(30)
    ours.set("hello", "rank 0")
    assert found["store"].port == ours.port and found["store"].get("hello") == b"rank 0"
