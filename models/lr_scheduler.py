"""Closed-form learning-rate schedules: the LR of step n is ``schedule(n)``, as in KAIR.

KAIR calls ``scheduler.step(n)`` before the n-th update, so the LR used at step n is the closed form at n. We
keep that, with one fix: with ``CosineAnnealingWarmRestarts`` a cycle ends *at* its last step (step ``T_0``
runs at ``eta_min``) instead of restarting there, so the final step of a run whose period equals ``total_iter``
is not taken at the full, restarted learning rate (KAIR's bug).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from typing import Any

import torch


def cosine_restart_position(step: int, period: int, mult: float) -> tuple[int, int]:
    """Position ``(t_cur, t_i)`` of ``step`` (1-based) in its cosine cycle; ``t_cur`` is in ``[1, t_i]``.

    Args:
        step: the optimisation step, from 1.
        period: the first cycle's length ``T_0``.
        mult: the cycle growth ``T_mult`` (>= 1).
    """
    if step <= 0:
        return 0, period
    t_i, start = period, 0
    while step > start + t_i:
        start += t_i
        t_i = int(round(t_i * mult))
    return step - start, t_i


def cosine_factor(step: int, period: int, mult: float) -> float:
    """The share of ``base_lr - eta_min`` left at ``step`` of a cosine schedule with restarts (1 at a cycle's start,
    0 at its end)."""
    t_cur, t_i = cosine_restart_position(step, period, mult)
    return (1 + math.cos(math.pi * t_cur / t_i)) / 2


class ClosedFormLR:
    """Set every parameter group's LR from a closed-form schedule of the step.

    Args:
        optimizer: the optimizer whose groups' ``initial_lr`` (set here from their current ``lr``) is the base.
        kind: ``CosineAnnealingWarmRestarts`` or ``MultiStepLR``.
        periods: ``T_0`` (cosine).
        restart_weights: ``T_mult`` (cosine; KAIR passes ``G_scheduler_restart_weights`` there).
        eta_min: minimum LR (cosine), absolute, shared by all groups.
        milestones: steps at which the LR is multiplied by ``gamma`` (multistep).
        gamma: decay factor (multistep).
    """

    def __init__(self, optimizer: torch.optim.Optimizer, kind: str, periods: int = 1, restart_weights: float = 1,
                 eta_min: float = 0.0, milestones: Sequence[int] = (), gamma: float = 0.5) -> None:
        if kind not in ("CosineAnnealingWarmRestarts", "MultiStepLR"):
            raise KeyError(f"train.G_scheduler_type={kind!r} is unknown; valid: CosineAnnealingWarmRestarts, "
                           "MultiStepLR")
        if kind == "CosineAnnealingWarmRestarts" and (periods < 1 or restart_weights < 1):
            raise ValueError(f"cosine schedule needs G_scheduler_periods >= 1 and G_scheduler_restart_weights >= 1, "
                             f"got {periods} and {restart_weights}")
        self.optimizer = optimizer
        self.kind = kind
        self.periods, self.mult, self.eta_min = int(periods), float(restart_weights), float(eta_min)
        self.milestones, self.gamma = sorted(int(m) for m in milestones), float(gamma)
        for group in optimizer.param_groups:
            group.setdefault("initial_lr", group["lr"])
        self.step_num = 0

    def lr_at(self, step: int, base_lr: float) -> float:
        """The LR of a group with base ``base_lr`` at ``step``."""
        if self.kind == "MultiStepLR":
            return base_lr * self.gamma ** bisect.bisect_right(self.milestones, step)
        if base_lr == 0:
            return 0.0
        return self.eta_min + (base_lr - self.eta_min) * cosine_factor(step, self.periods, self.mult)

    def set_step(self, step: int) -> None:
        """Set every group's LR for optimisation step ``step`` (call before the update)."""
        self.step_num = step
        for group in self.optimizer.param_groups:
            group["lr"] = self.lr_at(step, group["initial_lr"])

    def get_last_lr(self) -> list[float]:
        return [group["lr"] for group in self.optimizer.param_groups]

    def state_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "step": self.step_num,
                "initial_lr": [g["initial_lr"] for g in self.optimizer.param_groups]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for group, base in zip(self.optimizer.param_groups, state["initial_lr"]):
            group["initial_lr"] = base
        self.set_step(int(state["step"]))
