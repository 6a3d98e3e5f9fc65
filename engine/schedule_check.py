"""What a shortened run does to its schedule: every step-counted key that lies beyond ``train.total_iter`` gets one
warning line naming the key and its effect, and a GAN run whose generator would never take an adversarial step is
an error unless the option file asks for it (``train.allow_no_adversarial_steps``).

``--set train.total_iter=60`` on a recipe written for 300,000 steps keeps its ``gan_warmup_iter: 150``, its cosine
period of 300,000 steps and its ``checkpoint_test: 5000``: the run would silently be a pixel-only run that never
validates, at an almost constant learning rate. These lines say so before the first step.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from models.lr_scheduler import cosine_factor


def _cosine_note(prefix: str, t_opt: Mapping[str, Any], total: int) -> str | None:
    periods = t_opt.get(f"{prefix}_scheduler_periods")
    if periods is None or int(periods) <= total:
        return None
    eta_min = float(t_opt.get(f"{prefix}_scheduler_eta_min") or 0.0)
    # the share of the way from the base LR down to eta_min that the last step reaches
    mult = float(t_opt.get(f"{prefix}_scheduler_restart_weights") or t_opt.get("G_scheduler_restart_weights") or 1)
    fraction = cosine_factor(total, int(periods), mult)
    return (f"train.{prefix}_scheduler_periods = {periods} is beyond train.total_iter = {total}: the cosine learning "
            f"rate falls only {100 * (1 - fraction):.1f}% of the way to eta_min ({eta_min:g}) by the last step")


def schedule_notes(opt: Mapping[str, Any]) -> tuple[list[str], str | None]:
    """The warnings of a schedule whose step-counted keys lie beyond ``train.total_iter``, and the error of a GAN run
    whose generator never takes an adversarial step.

    Args:
        opt: parsed options.

    Returns:
        ``(warnings, error)``: one line per key, and ``None`` or the line of the error.
    """
    t_opt = opt["train"]
    total = int(t_opt["total_iter"])
    notes: list[str] = []
    for key, effect in (("checkpoint_test", "no validation runs during this run"),
                        ("checkpoint_save", f"only the last step ({total}) is saved"),
                        ("checkpoint_print", f"the only training log line is the last step's ({total})")):
        if int(t_opt[key] or 0) > total:
            notes.append(f"train.{key} = {t_opt[key]} is beyond train.total_iter = {total}: {effect}")
    fix_iter, fix_keys = int(t_opt.get("fix_iter") or 0), list(t_opt.get("fix_keys") or [])
    if fix_keys and fix_iter > total:
        notes.append(f"train.fix_iter = {fix_iter} is beyond train.total_iter = {total}: the parameters of "
                     f"fix_keys {fix_keys} stay frozen for the whole run")
    for prefix in ("G", "D") if opt.get("model") == "gan" else ("G",):
        kind = t_opt.get(f"{prefix}_scheduler_type") or t_opt.get("G_scheduler_type")
        if kind == "CosineAnnealingWarmRestarts":
            note = _cosine_note(prefix, t_opt, total)
            if note:
                notes.append(note)
        elif kind == "MultiStepLR":
            late = [int(m) for m in t_opt.get(f"{prefix}_scheduler_milestones") or [] if int(m) > total]
            if late:
                notes.append(f"train.{prefix}_scheduler_milestones {late} are beyond train.total_iter = {total}: "
                             "the learning rate never decays there")
    error = None
    if opt.get("model") == "gan":
        warmup, d_init = int(t_opt.get("gan_warmup_iter") or 0), int(t_opt.get("D_init_iters") or 0)
        ratio = max(int(t_opt.get("D_update_ratio") or 1), 1)
        first = max(warmup, d_init) + 1  # the first step that may train G against D
        first += (-first) % ratio
        if d_init >= total:
            notes.append(f"train.D_init_iters = {d_init} reaches train.total_iter = {total}: G is never updated, "
                         "only D trains")
        elif warmup >= total:
            notes.append(f"train.gan_warmup_iter = {warmup} reaches train.total_iter = {total}: every step trains "
                         "G on the pixel (and perceptual) losses alone; D never runs")
        if first > total and not t_opt.get("allow_no_adversarial_steps"):
            error = (f"this GAN run never trains G adversarially: its first adversarial step would be {first} "
                     f"(train.gan_warmup_iter = {warmup}, train.D_init_iters = {d_init}, train.D_update_ratio = "
                     f"{ratio}) and train.total_iter is {total}; lower those, raise total_iter, or set "
                     "train.allow_no_adversarial_steps=true to run the warm-up alone")
    return notes, error
