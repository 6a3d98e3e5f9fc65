"""Closed-form schedules: LR of step n = schedule(n); no full-LR restart on the final step."""

from __future__ import annotations

import math

import torch

from models.lr_scheduler import ClosedFormLR, cosine_restart_position


def _opt(lr=4e-4, groups=1):
    params = [torch.nn.Parameter(torch.zeros(1)) for _ in range(groups)]
    return torch.optim.Adam([{"params": [p], "lr": lr * (0.125 if i else 1)} for i, p in enumerate(params)])


def test_cosine_matches_torch_closed_form_inside_the_cycle():
    opt = _opt()
    sched = ClosedFormLR(opt, "CosineAnnealingWarmRestarts", periods=100, eta_min=1e-7)
    ref_opt = _opt()
    ref = torch.optim.lr_scheduler.CosineAnnealingWarmRestarts(ref_opt, T_0=100, eta_min=1e-7)
    for n in range(1, 100):
        sched.set_step(n)
        ref.step(n)
        assert math.isclose(opt.param_groups[0]["lr"], ref_opt.param_groups[0]["lr"], rel_tol=1e-12)


def test_final_step_is_not_restarted():
    opt = _opt()
    sched = ClosedFormLR(opt, "CosineAnnealingWarmRestarts", periods=100, eta_min=1e-7)
    sched.set_step(100)
    assert math.isclose(opt.param_groups[0]["lr"], 1e-7)
    sched.set_step(101)  # a second cycle starts after it
    assert opt.param_groups[0]["lr"] > 3.9e-4


def test_groups_keep_their_multiplier_and_share_eta_min():
    opt = _opt(groups=2)
    sched = ClosedFormLR(opt, "CosineAnnealingWarmRestarts", periods=10, eta_min=0.0)
    sched.set_step(5)
    assert math.isclose(opt.param_groups[1]["lr"] / opt.param_groups[0]["lr"], 0.125)


def test_restart_weights_grow_the_cycle():
    assert cosine_restart_position(10, 10, 2) == (10, 10)
    assert cosine_restart_position(11, 10, 2) == (1, 20)
    assert cosine_restart_position(30, 10, 2) == (20, 20)


def test_multistep():
    opt = _opt(lr=1.0)
    sched = ClosedFormLR(opt, "MultiStepLR", milestones=[3, 5], gamma=0.5)
    lrs = []
    for n in range(1, 7):
        sched.set_step(n)
        lrs.append(opt.param_groups[0]["lr"])
    assert lrs == [1.0, 1.0, 0.5, 0.5, 0.25, 0.25]


def test_state_dict_round_trip():
    opt = _opt()
    sched = ClosedFormLR(opt, "CosineAnnealingWarmRestarts", periods=50)
    sched.set_step(17)
    other_opt = _opt()
    other = ClosedFormLR(other_opt, "CosineAnnealingWarmRestarts", periods=50)
    other.load_state_dict(sched.state_dict())
    assert other_opt.param_groups[0]["lr"] == opt.param_groups[0]["lr"] and other.step_num == 17
