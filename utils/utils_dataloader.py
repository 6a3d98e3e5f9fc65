"""Training data loading: batch split over processes, a resumable distributed sampler, per-item seeding.

Each training item is produced under RNG states seeded from ``(seed, epoch, index)``, so an item's random
crop, flips and noise depend neither on the process nor on the worker that loads it. This is what makes
``2 processes x batch 1 == 1 process x batch 2`` and a resumed run bit-identical to an uninterrupted one, with
or without loader workers.
"""

from __future__ import annotations

import contextlib
import faulthandler
import logging
import os
import random
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from utils.utils_signals import ignore_stop_signals

logger = logging.getLogger(__name__)


class BatchSplitError(ValueError):
    """The total batch does not divide over the processes and accumulation steps."""


def split_batch(total: int, world_size: int, accum_steps: int = 1) -> int:
    """Per-process batch for a total (global) batch: ``total = per_process x world_size x accum_steps``.

    Raises:
        BatchSplitError: with the values that would work.
    """
    parts = world_size * accum_steps
    if total >= parts and total % parts == 0:
        return total // parts
    batches = [parts * k for k in range(1, 5)]
    procs = [n for n in range(1, total + 1) if total % (n * accum_steps) == 0]
    accums = [a for a in range(1, total + 1) if total % (world_size * a) == 0]
    hint = f"set datasets.train.dataloader_batch_size to one of {batches}"
    if procs:
        hint += f", or run {' / '.join(map(str, procs[:6]))} processes"
    if accums:
        hint += f", or set train.grad_accum_steps to one of {accums[:6]}"
    raise BatchSplitError(f"datasets.train.dataloader_batch_size={total} does not divide over {world_size} "
                          f"process(es) x {accum_steps} accumulation step(s); {hint}")


def auto_accum_steps(total: int, world_size: int, per_process: int) -> int:
    """Accumulation steps that keep ``per_process`` clips per process at the global batch ``total``
    (``train.grad_accum_steps: "auto"`` resuming a checkpoint trained with that per-process batch).

    Raises:
        BatchSplitError: ``total`` is not a multiple of ``per_process x world_size``; names the numbers of processes
            that keep the per-process batch and the accumulation values that work with ``world_size`` processes.
    """
    if total % (per_process * world_size) == 0:
        return total // (per_process * world_size)
    procs = [n for n in range(1, total // per_process + 1) if total % (per_process * n) == 0]
    accums = [a for a in range(1, total + 1) if total % (world_size * a) == 0]
    hints = []
    if procs:
        hints.append(f"run {' / '.join(map(str, procs[:6]))} processes to keep it")
    if accums:
        hints.append("set train.grad_accum_steps to one of " + ", ".join(
            f"{a} (per-process batch {total // (world_size * a)})" for a in accums[:6]))
    raise BatchSplitError(f"train.grad_accum_steps='auto' keeps the checkpoint's per-process batch of {per_process}, "
                          f"but the global batch {total} is not a multiple of {per_process} x {world_size} "
                          f"process(es); {', or '.join(hints) or 'change datasets.train.dataloader_batch_size'}")


def item_seed(seed: int, epoch: int, index: int) -> int:
    """A 32-bit seed for one training item."""
    return int(np.random.SeedSequence([seed, epoch, index]).generate_state(1)[0])


@contextlib.contextmanager
def seeded_rng(seed: int) -> Iterator[None]:
    """Run a block with ``random``, NumPy and torch (CPU) seeded from ``seed``; restore their states after."""
    py_state, np_state, torch_state = random.getstate(), np.random.get_state(), torch.get_rng_state()
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    try:
        yield
    finally:
        random.setstate(py_state)
        np.random.set_state(np_state)
        torch.set_rng_state(torch_state)


class SeededItems(Dataset):
    """Wrap a dataset so that item ``(epoch, index)`` is drawn under RNGs seeded from ``(seed, epoch, index)``."""

    def __init__(self, dataset: Dataset, seed: int) -> None:
        self.dataset = dataset
        self.seed = seed

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]

    def __getitem__(self, key: tuple[int, int]) -> Any:
        epoch, index = key
        with seeded_rng(item_seed(self.seed, epoch, index)):
            return self.dataset[index]


class ResumableSampler(DistributedSampler):
    """``DistributedSampler`` that yields ``(epoch, index)`` keys and can skip the start of an epoch.

    Args:
        dataset: the dataset (only its length is used).
        num_replicas: world size.
        rank: this process's rank.
        shuffle: reshuffle every epoch (``set_epoch`` is called by the loop).
        seed: the seed all ranks agree on.
    """

    def __init__(self, dataset: Dataset, num_replicas: int, rank: int, shuffle: bool, seed: int) -> None:
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=shuffle, seed=seed, drop_last=True)
        self.skip = 0

    def set_position(self, epoch: int, items_in_epoch: int) -> None:
        """Start epoch ``epoch`` after the first ``items_in_epoch`` items that all ranks together consumed (resume
        mid-epoch, on any number of processes).

        The ranks take the epoch's permutation interleaved (rank r: positions r, r + world, ...) and every global
        step takes its next ``global batch`` positions, whatever the split over processes, per-process batches and
        accumulation steps; so after ``k`` steps each rank has consumed ``k x global batch / world`` of its share.
        """
        self.set_epoch(epoch)
        self.skip = items_in_epoch // self.num_replicas

    def __iter__(self) -> Iterator[tuple[int, int]]:  # type: ignore[override]
        indices = list(super().__iter__())[self.skip:]
        self.skip = 0
        return iter([(self.epoch, i) for i in indices])

    def __len__(self) -> int:
        return self.num_samples


STACK_SIGNAL = getattr(signal, "SIGUSR2", None)
CHILD_SIGNAL = getattr(signal, "SIGCHLD", None)


class DataLoaderStallError(RuntimeError):
    """No batch arrived within ``train.dataloader_timeout`` seconds."""


def worker_init_fn(worker_id: int) -> None:
    """Give each loader worker distinct module RNG streams (items are re-seeded per item anyway), let it print its
    stack on SIGUSR2 (used when the loader stalls), and leave stop signals sent to the whole job to the main
    process, which stops at a step boundary (:mod:`utils.utils_signals`)."""
    ignore_stop_signals()
    base = torch.initial_seed() % 2**32
    random.seed(base + worker_id)
    np.random.seed((base + worker_id) % 2**32)
    if STACK_SIGNAL is not None:
        faulthandler.register(STACK_SIGNAL, all_threads=True)


def _end_workers(workers: list[Any]) -> None:
    """Kill stalled loader workers and wait for their exit.

    A stalled worker never returns to its loop, and it ignores SIGTERM (stop signals belong to the main process), so
    the loader's shutdown could not end it and the exit would wait on it forever. The DataLoader's SIGCHLD handler
    would answer the kill with its own "DataLoader worker (pid N) is killed by signal: Killed" in place of the stall
    error, whenever the child's exit is signalled before that error is raised: SIGCHLD is left at its default
    (ignored) until the workers are gone.
    """
    alive = [w for w in workers if w.pid is not None and w.is_alive()]
    if not alive:
        return
    # only the main thread may set handlers; SIGCHLD is POSIX's
    quiet = CHILD_SIGNAL is not None and threading.current_thread() is threading.main_thread()
    previous = signal.signal(CHILD_SIGNAL, signal.SIG_DFL) if quiet else None
    try:
        for worker in alive:
            worker.kill()
        for worker in alive:
            worker.join(timeout=10.0)
    finally:
        if quiet:
            signal.signal(CHILD_SIGNAL, signal.SIG_DFL if previous is None else previous)


def next_batch(iterator: Iterator[Any], timeout: float) -> Any | None:
    """The next batch, or ``None`` at the end of the epoch.

    Raises:
        DataLoaderStallError: the loader timed out; each worker's stack is printed to stderr first.
    """
    try:
        return next(iterator, None)
    except RuntimeError as exc:
        if "timed out" not in str(exc):
            raise
        workers = getattr(iterator, "_workers", [])
        for worker in workers:
            if STACK_SIGNAL is not None and worker.pid is not None and worker.is_alive():
                os.kill(worker.pid, STACK_SIGNAL)
        time.sleep(1.0)  # let the workers write their stacks
        _end_workers(workers)
        raise DataLoaderStallError(f"the training data loader produced no batch for {timeout:g} s "
                                   f"(train.dataloader_timeout); the stacks of its {len(workers)} worker(s) are "
                                   "printed above on stderr") from exc


def build_train_loader(dataset: Dataset, dataset_opt: dict[str, Any], *, rank: int, world_size: int, seed: int,
                       accum_steps: int, pin_memory: bool, timeout: float = 0) -> tuple[DataLoader, ResumableSampler]:
    """A training DataLoader with KAIR's totals split over processes.

    Args:
        dataset: the training dataset.
        dataset_opt: ``datasets.train`` options (``dataloader_batch_size`` and ``dataloader_num_workers`` are
            totals over all processes, as in KAIR).
        rank: global rank.
        world_size: number of processes.
        seed: the seed all ranks agree on.
        accum_steps: gradient accumulation steps.
        pin_memory: pin host memory (CUDA training).
        timeout: seconds a batch may take before the loader raises (0 = wait forever).

    Returns:
        ``(loader, sampler)``.
    """
    total = int(dataset_opt.get("dataloader_batch_size", 1))
    per_process = split_batch(total, world_size, accum_steps)
    workers = int(dataset_opt.get("dataloader_num_workers", 0)) // world_size
    sampler = ResumableSampler(dataset, world_size, rank, bool(dataset_opt.get("dataloader_shuffle", True)), seed)
    if len(sampler) < per_process:
        raise ValueError(f"the training set has {len(dataset)} items, too few for a batch of {per_process} on each "
                         f"of {world_size} process(es)")
    # A private generator: creating an iterator draws a base seed from it, and a draw from the global RNG would
    # shift the stream that stochastic depth uses, so a resumed run (one iterator more) would not be bit-identical.
    generator = torch.Generator().manual_seed(seed)
    loader = DataLoader(SeededItems(dataset, seed), batch_size=per_process, sampler=sampler, num_workers=workers,
                        drop_last=True, pin_memory=pin_memory, worker_init_fn=worker_init_fn, generator=generator,
                        persistent_workers=workers > 0, prefetch_factor=4 if workers > 0 else None,
                        timeout=timeout if workers > 0 else 0)
    logger.info("Global batch %d = %d per process x %d process(es) x %d accumulation step(s); %d loader worker(s) "
                "per process", total, per_process, world_size, accum_steps, workers)
    return loader, sampler
