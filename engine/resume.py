"""Resuming a run: which checkpoint, on how many processes with which accumulation, and whether the continuation
can be bit-exact (and why not)."""

from __future__ import annotations

import logging
import os
import socket
from typing import Any

import numpy as np
import torch

from utils import utils_checkpoint as ckpt
from utils import utils_dist
from utils.utils_dataloader import auto_accum_steps
from utils.utils_dist import DistInfo
from utils.utils_option_schema import SCHEMA

logger = logging.getLogger(__name__)


class ResumeError(ValueError):
    """The experiment folder cannot be continued with these options."""


def resume_step(opt: dict[str, Any]) -> int:
    models = opt["path"]["models"]
    step = utils_dist.broadcast_object(ckpt.latest_complete_step(models))
    total = opt["train"]["total_iter"]
    if step > total:
        raise ResumeError(f"{models} holds a complete checkpoint at step {step} but "
                          f"train.total_iter={total}; set train.total_iter above {step} to continue, or use a new "
                          "'task' name to start another experiment")
    if step:
        check_checkpoint_visible(models, step)
    return step


def check_checkpoint_visible(models_dir: str, step: int) -> None:
    """Every rank reads the checkpoint that rank 0 found (rank 0 alone writes them).

    Raises:
        ResumeError: on every rank, naming the ranks and hosts that cannot see it (``path.root`` on a disk of rank
            0's node rather than on storage every node shares).
    """
    path = os.path.join(models_dir, f"{step}_state.pth")
    seen = utils_dist.all_gather_object((os.path.isfile(path), socket.gethostname()))
    blind = [f"rank {rank} ({host})" for rank, (visible, host) in enumerate(seen) if not visible]
    if blind:
        more = f" and {len(blind) - 4} more" if len(blind) > 4 else ""
        raise ResumeError(f"{', '.join(blind[:4])}{more} cannot see {path}, which rank 0 found: rank 0 writes the "
                          "checkpoints and every rank reads them, so path.root must be on storage that every node "
                          "shares (NFS, Lustre, a ReadWriteMany volume)")


def resolve_grad_accum(option: int | str, saved: dict[str, Any] | None, world_size: int,
                       total: int) -> tuple[int, str | None]:
    """``train.grad_accum_steps`` of this run, and the line stating how a resume follows a change in the number of
    processes (``None`` when it did not change).

    Args:
        option: ``train.grad_accum_steps``: a number, or ``"auto"``: keep the per-process batch of the checkpoint
            (memory-safe), accumulating ``total / (per-process batch x world_size)`` micro-batches; 1 for a new run.
        saved: the descriptor stored with the checkpoint (``None``: a new run, or a checkpoint that predates it).
        world_size: processes of this run.
        total: the global batch (``datasets.train.dataloader_batch_size``).

    Raises:
        BatchSplitError: ``"auto"`` cannot keep the per-process batch on this many processes (one line naming the
            numbers of processes and the values that work).
    """
    if option != "auto":
        accum = int(option)
    elif saved is None:
        accum = 1
    else:
        accum = auto_accum_steps(total, world_size, int(saved["per_process_batch"]))
    if saved is None or saved["world_size"] == world_size or total % (world_size * accum):
        return accum, None  # unchanged, or a split that build_train_loader reports with its hint
    old_batch, old_accum = int(saved["per_process_batch"]), int(saved["grad_accum_steps"])
    per_process = total // (world_size * accum)
    line = f"{saved['world_size']} -> {world_size} processes: grad_accum_steps "
    line += f"{old_accum} -> {accum}, " if accum != old_accum else f"{accum} kept, "
    line += f"per-process batch {old_batch} kept" if per_process == old_batch else \
        f"per-process batch {old_batch} -> {per_process}"
    old_total = old_batch * int(saved["world_size"]) * old_accum
    if old_total != total:
        line += f", global batch {old_total} -> {total}"
    if per_process > old_batch and option != "auto":
        line += " (train.grad_accum_steps='auto' keeps the per-process batch)"
    return accum, line


def rank_stream_seed(seed: int, step: int, rank: int) -> int:
    """Seed of a rank's random streams (stochastic depth) after a resume on another number of processes: fresh
    streams that do not replay those of step 1, the same in every such resume from ``step``."""
    return int(np.random.SeedSequence([seed, step, rank, 1]).generate_state(1)[0])


# Keys that do not change the numbers a run computes: a resume may change them and stay exact.
NON_NUMERIC_TRAIN_KEYS = ("total_iter", "checkpoint_save", "checkpoint_print", "checkpoint_test",
                          "dataloader_timeout", "manual_seed", "G_scheduler_periods",
                          "grad_accum_steps")  # the resolved split is compared instead (per-process and global batch)
NON_NUMERIC_DATASET_KEYS = ("dataloader_num_workers", "dataroot_gt", "dataroot_lq", "meta_info_file", "io_backend",
                            "cache_data", "check_data", "check_decode_samples", "name", "index_dir", "strict",
                            "synthesize_if_missing")


def run_descriptor(opt: dict[str, Any], dist_info: DistInfo, per_process: int, accum: int) -> dict[str, Any]:
    """What decides the numbers of a run beyond the checkpoint's tensors (saved with every checkpoint)."""
    t_opt = opt["train"]
    train_opt = next(v for k, v in opt["datasets"].items() if k.startswith("train"))
    periods = t_opt["G_scheduler_periods"]
    return {"world_size": dist_info.world_size, "per_process_batch": per_process, "grad_accum_steps": accum,
            "deterministic": t_opt["deterministic"], "device": dist_info.device.type,
            "threads": torch.get_num_threads(), "torch": str(torch.__version__),
            "scheduler_periods": list(periods) if isinstance(periods, list) else periods,
            "train": {k: v for k, v in t_opt.items() if k not in NON_NUMERIC_TRAIN_KEYS},
            "dataset": {k: v for k, v in train_opt.items() if k not in NON_NUMERIC_DATASET_KEYS}}


def inexact_resume_reasons(saved: dict[str, Any] | None, current: dict[str, Any], optimizer_reuse: bool) -> list[str]:
    """Why a resume cannot continue bit-identically (empty when it can).

    Args:
        saved: the descriptor stored with the checkpoint (``None`` for checkpoints that predate it).
        current: :func:`run_descriptor` of this run.
        optimizer_reuse: ``train.G_optimizer_reuse``.
    """
    reasons = []
    if not optimizer_reuse:
        reasons.append("train.G_optimizer_reuse is false, so the optimizer state starts afresh (KAIR's meaning)")
    if not current["deterministic"]:
        reasons.append("train.deterministic is false")
    if saved is None:
        return reasons + ["the checkpoint does not record the settings it was trained with"]
    if saved["world_size"] != current["world_size"]:
        reasons.append(f"{saved['world_size']} process(es) trained the checkpoint, {current['world_size']} continue "
                       "(per-rank random streams are re-seeded; float sums run in another order)")
    if saved["per_process_batch"] != current["per_process_batch"]:
        reasons.append(f"the per-process batch changed ({saved['per_process_batch']} -> "
                       f"{current['per_process_batch']})")
    saved_global = saved["per_process_batch"] * saved["world_size"] * saved["grad_accum_steps"]
    current_global = current["per_process_batch"] * current["world_size"] * current["grad_accum_steps"]
    if saved_global != current_global:
        reasons.append(f"the global batch changed ({saved_global} -> {current_global})")
    for key, label in (("device", "device type"), ("threads", "intra-op thread count"), ("torch", "torch version"),
                       ("scheduler_periods", "LR schedule (G_scheduler_periods)")):
        if saved.get(key) != current.get(key):
            reasons.append(f"the {label} changed ({saved.get(key)} -> {current.get(key)})")
    for section, label in (("train", "train"), ("dataset", "datasets.train")):
        changed = _changed_keys(saved[section], current[section], section)
        if changed:
            reasons.append(f"the '{label}' section changed ({', '.join(changed)})")
    return reasons


def _changed_keys(saved: dict[str, Any], current: dict[str, Any], section: str) -> list[str]:
    """Keys whose values differ. A ``train`` key that one side lacks (the checkpoint predates it) counts as its
    schema default there: adding a key whose default keeps the old behaviour does not make old checkpoints
    inexact."""
    absent = object()

    def value(values: dict[str, Any], key: str) -> Any:
        spec = SCHEMA.get(f"train.{key}") if section == "train" else None
        return values.get(key, spec.default if spec is not None else absent)

    return sorted(k for k in set(saved) | set(current) if value(saved, k) != value(current, k))


def epoch_items(state: dict[str, Any], per_process: int) -> int:
    """Items of the current epoch consumed by all ranks together (older checkpoints counted per-rank batches)."""
    if "items_in_epoch" in state:
        return int(state["items_in_epoch"])
    return int(state.get("batches_in_epoch", 0)) * per_process * len(state.get("rng") or [None])
