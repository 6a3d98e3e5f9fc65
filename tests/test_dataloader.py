"""Batch split over processes, the resumable sampler and per-item seeding."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from torch.utils.data import Dataset

from utils.utils_dataloader import BatchSplitError, ResumableSampler, SeededItems, split_batch


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
    sampler.set_position(0, 2)
    assert list(sampler) == full[0][2:]
    assert list(sampler) == full[0]  # the skip applies once
    sampler.set_epoch(1)
    assert all(e == 1 for e, _ in sampler) and list(sampler) != full[0]
