"""Batch split over processes, the resumable sampler, per-item seeding and a stalled loader's error."""

from __future__ import annotations

import faulthandler
import multiprocessing
import random
import signal
import time

import numpy as np
import pytest
import torch
from torch.utils.data import Dataset

from utils.utils_dataloader import (
    BatchSplitError,
    DataLoaderStallError,
    ResumableSampler,
    SeededItems,
    auto_accum_steps,
    next_batch,
    split_batch,
)


def test_split_batch():
    assert split_batch(8, 8) == 1
    assert split_batch(8, 2) == 4
    assert split_batch(8, 2, accum_steps=2) == 2
    with pytest.raises(BatchSplitError, match=r"dataloader_batch_size=4 does not divide over 8 process.*\[8, 16"):
        split_batch(4, 8)
    with pytest.raises(BatchSplitError, match=r"run 1 / 2 / 3 / 6 processes"):
        split_batch(6, 4)


class _Random(Dataset):
    def __len__(self):
        return 10

    def __getitem__(self, i):
        return (i, random.random(), float(np.random.rand()), float(torch.rand(1)))


def test_seeded_items_depend_only_on_epoch_and_index():
    ds = SeededItems(_Random(), seed=5)
    a = ds[(0, 3)]
    random.random(), np.random.rand(), torch.rand(1)  # disturb the global streams
    assert ds[(0, 3)] == a
    assert ds[(1, 3)] != a
    before = random.getstate()
    ds[(0, 4)]
    assert random.getstate() == before  # the caller's RNG state is restored


def test_sampler_shards_and_resumes():
    ds = _Random()
    full = [list(ResumableSampler(ds, 2, r, True, seed=1)) for r in range(2)]
    assert sorted(i for part in full for _, i in part) == list(range(10))
    one = list(ResumableSampler(ds, 1, 0, True, seed=1))
    assert [i for _, i in one][0::2] == [i for _, i in full[0]]  # same permutation as one process
    sampler = ResumableSampler(ds, 2, 0, True, seed=1)
    sampler.set_position(0, 4)  # 4 items over both ranks: 2 of each
    assert list(sampler) == full[0][2:]
    assert list(sampler) == full[0]  # the skip applies once
    sampler.set_epoch(1)
    assert all(e == 1 for e, _ in sampler) and list(sampler) != full[0]


def test_auto_accumulation_keeps_the_per_process_batch():
    assert auto_accum_steps(8, 8, 1) == 1 and auto_accum_steps(8, 4, 1) == 2 and auto_accum_steps(8, 1, 2) == 4
    with pytest.raises(BatchSplitError, match=r"global batch 8 is not a multiple of 1 x 3 process\(es\); run "
                       r"1 / 2 / 4 / 8 processes to keep it$"):
        auto_accum_steps(8, 3, 1)
    with pytest.raises(BatchSplitError, match=r"per-process batch of 4, but the global batch 6 is not a multiple of "
                       r"4 x 1 process\(es\); set train.grad_accum_steps to one of 1 \(per-process batch 6\), "
                       r"2 \(per-process batch 3\), 3 \(per-process batch 2\), 6 \(per-process batch 1\)$"):
        auto_accum_steps(6, 1, 4)


class _Sized(Dataset):
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n


def _steps(n, world, per_process, accum, shuffle, epoch=0, start_step=0):
    """The items of each global step of one epoch, as the training loop draws them: every rank's sampler (skipping
    ``items_in_epoch // world`` after ``start_step`` steps), loader batches of ``per_process`` (drop_last), ``accum``
    batches per step; the epoch ends when a rank lacks a full step."""
    per_rank = []
    for rank in range(world):
        sampler = ResumableSampler(_Sized(n), world, rank, shuffle, seed=3)
        sampler.set_position(epoch, start_step * per_process * world * accum)  # what the loop counts
        idx = [i for _, i in sampler]
        batches = [idx[b:b + per_process] for b in range(0, len(idx) - per_process + 1, per_process)]
        per_rank.append([sum(batches[s:s + accum], []) for s in range(0, len(batches) - accum + 1, accum)])
    count = min(len(steps) for steps in per_rank)
    assert all(len(steps) == count for steps in per_rank)  # every rank ends the epoch at the same step
    return [sorted(i for steps in per_rank for i in steps[s]) for s in range(count)]


@pytest.mark.parametrize("shuffle", [True, False])
@pytest.mark.parametrize("n", [7, 8, 13])
def test_every_split_of_a_global_batch_trains_the_same_items_at_every_step_and_resumes_on_another(n, shuffle):
    """The same global batch split over any number of processes, per-process batches and accumulation steps gives the
    same items at every step of an epoch (epoch ends included), and a resume after any step on another split continues
    with the items of the uninterrupted run."""
    for total in (1, 2, 3, 4, 6):
        splits = [(w, p, total // (w * p)) for w in range(1, total + 1) for p in range(1, total + 1)
                  if total % (w * p) == 0]
        for epoch in (0, 1):
            reference = _steps(n, 1, total, 1, shuffle, epoch)
            assert len(reference) == n // total
            for world, per_process, accum in splits:
                assert _steps(n, world, per_process, accum, shuffle, epoch) == reference, (total, world, per_process)
                for stop in range(len(reference) + 1):
                    for world2, per_process2, accum2 in splits:
                        resumed = _steps(n, world2, per_process2, accum2, shuffle, epoch, start_step=stop)
                        assert resumed == reference[stop:], (total, world, world2, per_process2, stop)


def _stalled_worker(ready) -> None:
    faulthandler.register(signal.SIGUSR2, all_threads=True)  # as worker_init_fn does: the stack on SIGUSR2
    ready.set()
    time.sleep(60)


@pytest.mark.skipif(not hasattr(signal, "SIGCHLD"), reason="POSIX signals")
def test_a_stalled_loader_reports_the_stall_not_the_kill_of_its_worker():
    """After a loader timeout the stalled worker is killed; torch's DataLoader answers a worker's death from its
    SIGCHLD handler ("DataLoader worker (pid N) is killed by signal: Killed"), which must not replace the stall
    error: here the handler raises as torch's does, and the worker's exit is signalled for sure before the test
    ends (it is reaped, then the test waits)."""
    ctx = multiprocessing.get_context("fork")
    ready = ctx.Event()
    worker = ctx.Process(target=_stalled_worker, args=(ready,), daemon=True)
    worker.start()
    assert ready.wait(30)

    class Stalled:
        _workers = [worker]

        def __next__(self):
            raise RuntimeError("DataLoader timed out after 3 seconds")

    def torch_like(signum, frame):
        raise RuntimeError(f"DataLoader worker (pid {worker.pid}) is killed by signal: Killed.")

    previous = signal.signal(signal.SIGCHLD, torch_like)
    try:
        with pytest.raises(DataLoaderStallError, match="produced no batch for 3 s"):
            next_batch(Stalled(), 3.0)
        assert not worker.is_alive()
        time.sleep(0.3)  # a SIGCHLD still pending would run torch_like here
        assert signal.getsignal(signal.SIGCHLD) is torch_like  # the loader's handler is back
    finally:
        signal.signal(signal.SIGCHLD, previous)
        if worker.is_alive():
            worker.kill()
