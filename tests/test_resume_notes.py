"""A resume that cannot be bit-exact says why, once, in the log (and one that can says nothing)."""

from __future__ import annotations

import copy
import os

import torch

from engine.resume import inexact_resume_reasons, run_descriptor
from tests.support.helpers import assert_ok, base_env, single, write_opt
from utils.utils_dist import DistInfo

OPT = {"train": {"deterministic": True, "G_optimizer_lr": 1e-3, "total_iter": 10, "checkpoint_save": 5,
                 "G_scheduler_periods": 100},
       "datasets": {"train": {"gt_size": 32, "dataloader_batch_size": 4, "dataloader_num_workers": 2}}}


def _descriptor(opt=OPT, world=1, per_process=4, accum=1):
    return run_descriptor(opt, DistInfo(0, 0, world, torch.device("cpu")), per_process, accum)


def test_an_unchanged_run_resumes_exactly_even_with_other_bookkeeping():
    changed = copy.deepcopy(OPT)
    changed["train"].update(total_iter=20, checkpoint_save=1)  # when to stop and save: not the numbers
    changed["datasets"]["train"]["dataloader_num_workers"] = 8  # items are seeded per item, not per worker
    assert inexact_resume_reasons(_descriptor(), _descriptor(changed), optimizer_reuse=True) == []


def test_each_reason_is_named():
    saved = _descriptor()
    lr = copy.deepcopy(OPT)
    lr["train"]["G_optimizer_lr"] = 2e-3
    periods = copy.deepcopy(OPT)
    periods["train"]["G_scheduler_periods"] = 200
    crop = copy.deepcopy(OPT)
    crop["datasets"]["train"]["gt_size"] = 64
    nondet = copy.deepcopy(OPT)
    nondet["train"]["deterministic"] = False
    cases = [
        (_descriptor(), False, "G_optimizer_reuse is false"),
        (_descriptor(world=2, per_process=2), True, "1 process(es) trained the checkpoint, 2 continue"),
        (_descriptor(per_process=2, accum=2), True, "per-process batch changed (4 -> 2)"),
        (_descriptor(per_process=2), True, "global batch changed (4 -> 2)"),
        (_descriptor(lr), True, "'train' section changed (G_optimizer_lr)"),
        (_descriptor(periods), True, "LR schedule (G_scheduler_periods) changed (100 -> 200)"),
        (_descriptor(crop), True, "'datasets.train' section changed (gt_size)"),
        (_descriptor(nondet), True, "train.deterministic is false"),
    ]
    for current, reuse, expected in cases:
        reasons = inexact_resume_reasons(saved, current, optimizer_reuse=reuse)
        assert any(expected in r for r in reasons), (expected, reasons)
    threads = dict(saved, threads=saved["threads"] + 1)
    assert any("intra-op thread count changed" in r for r in inexact_resume_reasons(saved, threads, True))
    assert any("does not record" in r for r in inexact_resume_reasons(None, saved, True))


def test_the_log_says_it_once(tmp_path):
    opt = write_opt(tmp_path, train={"total_iter": 2, "checkpoint_save": 2})
    assert_ok(single(["--opt", opt], base_env(), str(tmp_path)))
    again = single(["--opt", opt, "--set", "train.total_iter=4", "train.G_optimizer_lr=0.002"], base_env(),
                   str(tmp_path))
    assert_ok(again)
    log = open(os.path.join(tmp_path, "experiments", "tiny", "train.log")).read()
    assert log.count("Resume from step 2 is not bit-exact") == 1
    assert "the 'train' section changed (G_optimizer_lr)" in log
