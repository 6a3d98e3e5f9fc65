"""The training loop: exactly ``total_iter`` steps, KAIR log lines, checkpoints, validation, resume, preemption."""

from __future__ import annotations

import logging
import os
import random
import resource
import signal
import socket
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from data.select_dataset import define_Dataset
from engine.validate import validate
from models import memory_plan
from models.network_spynet import SPYNET_SHA256_PREFIX, SPYNET_URL
from models.select_model import define_Model
from models.select_network import is_frame_interpolation
from utils import utils_checkpoint as ckpt
from utils import utils_dist, utils_numerics
from utils.utils_dataloader import auto_accum_steps, build_train_loader, next_batch
from utils.utils_dist import DistInfo
from utils.utils_download import ensure_file
from utils.utils_launch import STOP_ENV
from utils.utils_logger import TensorBoardWriter

logger = logging.getLogger(__name__)


class ConfigError(ValueError):
    """An option, dataset or network problem found while building the run."""


class ResumeError(ValueError):
    """The experiment folder cannot be continued with these options."""


STOP_SIGNALS = ("SIGTERM", "SIGUSR1", "SIGINT")


class StopRequest:
    """Remembers a SIGTERM/SIGUSR1/SIGINT so the loop can checkpoint at the next step boundary and exit.

    A second SIGINT (Ctrl-C pressed twice in a terminal) interrupts at once, as Python does by default.
    """

    def __init__(self) -> None:
        self.signal_name: str | None = os.environ.get(STOP_ENV) or None
        self._previous: dict[int, Any] = {}

    def install(self) -> None:
        for name in STOP_SIGNALS:
            signum = getattr(signal, name, None)
            if signum is not None:
                self._previous[signum] = signal.signal(signum, self._handle)

    def _handle(self, signum: int, frame: Any) -> None:
        del frame
        if signum == signal.SIGINT and self.signal_name == "SIGINT":
            raise KeyboardInterrupt
        self.signal_name = signal.Signals(signum).name  # nothing else here: a handler may interrupt logging

    def uninstall(self) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()

    def agreed(self) -> bool:
        """True on every rank when any rank received a stop signal (one small all-reduce)."""
        return utils_dist.all_reduce_max_int(int(self.signal_name is not None)) > 0


def agree_seed(train_opt: dict[str, Any]) -> int:
    """``train.manual_seed`` or a seed drawn on rank 0, the same on every rank."""
    seed = train_opt["manual_seed"]
    if seed is None:
        seed = random.SystemRandom().randint(1, 10000)
    return int(utils_dist.broadcast_object(seed))


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def peak_memory_gb(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux


def input_baseline(lq: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """The input as an estimate of the output: bicubic-upsampled LQ (SR), the LQ itself (deblurring/denoising),
    or the mean of the two middle input frames (interpolation).

    Args:
        lq: ``(1, T, C, h, w)``.
        like: an output tensor ``(1, T', 3, H, W)`` giving the target shape.
    """
    frames = lq[0, :, :3]
    if like.shape[1] != frames.shape[0]:
        mid = frames.shape[0] // 2
        frames = frames[max(mid - 1, 0):mid + 1].mean(0, keepdim=True)
    if frames.shape[-2:] != like.shape[-2:]:
        frames = F.interpolate(frames, size=like.shape[-2:], mode="bicubic", align_corners=False)
    return frames.clamp(0, 1)[None]


def fetch_weights(opt: dict[str, Any]) -> None:
    """Rank 0 fetches the official SpyNet weights when ``netG.spynet_path`` names a missing file (SHA-256-verified,
    atomic), then every rank goes on; the networks themselves never download.

    Raises:
        ConfigError: the file is missing and could not be downloaded (e.g. offline), on every rank.
    """
    path = opt["netG"].get("spynet_path")
    error = None
    if path and not os.path.isfile(path) and utils_dist.get_rank() == 0:
        try:
            ensure_file(path, SPYNET_URL, SPYNET_SHA256_PREFIX)
        except (RuntimeError, ValueError, OSError) as exc:
            error = str(exc)
    error = utils_dist.broadcast_object(error)
    if error:
        raise ConfigError(f"netG.spynet_path = {path!r} is missing and could not be fetched: {error}")


def _build(opt: dict[str, Any], dist_info: DistInfo) -> tuple[Any, Any, Any]:
    try:
        datasets = opt["datasets"]
        if "train" not in {k.split("_")[0] for k in datasets}:
            raise ConfigError("option 'datasets' needs a 'train' entry")
        train_key = next(k for k in datasets if k.startswith("train"))
        train_set = define_Dataset(datasets[train_key])
        test_key = next((k for k in datasets if k.startswith("test")), None)
        test_set = define_Dataset(datasets[test_key]) if test_key else None
        model = define_Model(opt, dist_info)
    except (KeyError, TypeError, ValueError) as exc:
        if isinstance(exc, ConfigError):
            raise
        msg = exc.args[0] if isinstance(exc, KeyError) and exc.args else str(exc)
        raise ConfigError(str(msg)) from exc
    return train_set, test_set, model


def _resume_step(opt: dict[str, Any]) -> int:
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
                            "cache_data", "check_data", "check_decode_samples", "name")


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
        changed = sorted(k for k in set(saved[section]) | set(current[section])
                         if saved[section].get(k) != current[section].get(k))
        if changed:
            reasons.append(f"the '{label}' section changed ({', '.join(changed)})")
    return reasons


def _epoch_items(state: dict[str, Any], per_process: int) -> int:
    """Items of the current epoch consumed by all ranks together (older checkpoints counted per-rank batches)."""
    if "items_in_epoch" in state:
        return int(state["items_in_epoch"])
    return int(state.get("batches_in_epoch", 0)) * per_process * len(state.get("rng") or [None])


def train(opt: dict[str, Any], dist_info: DistInfo, on_ready: Callable[[], None] | None = None) -> dict[str, Any]:
    """Run (or resume) the training described by ``opt``.

    Args:
        opt: parsed options.
        dist_info: this process's place in the job.
        on_ready: called once everything is built and loaded, before the first file is written (``main`` opens
            the log file and saves the options there), so a run that fails on bad input leaves an existing
            experiment untouched.

    Returns:
        A summary: ``{'step', 'epoch', 'best_psnr', 'best_step', 'last_val', 'stopped_by'}``.
    """
    numerics_before = utils_numerics.current_state()
    try:
        return _train(opt, dist_info, on_ready)
    finally:
        utils_numerics.restore_state(numerics_before)


def _train(opt: dict[str, Any], dist_info: DistInfo, on_ready: Callable[[], None] | None) -> dict[str, Any]:
    t_opt, paths = opt["train"], opt["path"]
    numerics = utils_numerics.apply_policy(bool(t_opt["deterministic"]), bool(t_opt["tf32"]), dist_info.device)
    start_step = _resume_step(opt)
    seed = agree_seed(t_opt)
    seed_everything(seed)  # the same initial weights on every rank and in every run with this seed
    fetch_weights(opt)
    train_set, test_set, model = _build(opt, dist_info)
    model.init_train()
    train_state: dict[str, Any] = {}
    if start_step:
        train_state = model.resume(start_step)
    else:
        model.load_pretrained()
    seed = int(train_state.get("seed") or seed)
    rngs = train_state.get("rng")
    same_ranks = bool(rngs) and len(rngs) == dist_info.world_size
    if start_step and not same_ranks:
        seed_everything(rank_stream_seed(seed, start_step, dist_info.rank))
    else:
        seed_everything(seed + dist_info.rank)
    if same_ranks:
        ckpt.restore_rng_state(rngs[dist_info.rank])

    train_opt = next(v for k, v in opt["datasets"].items() if k.startswith("train"))
    accum, world_change = resolve_grad_accum(t_opt["grad_accum_steps"], train_state.get("run"), dist_info.world_size,
                                             int(train_opt.get("dataloader_batch_size", 1)))
    loader, sampler = build_train_loader(train_set, train_opt, rank=dist_info.rank, world_size=dist_info.world_size,
                                         seed=seed, accum_steps=accum, pin_memory=dist_info.device.type == "cuda",
                                         timeout=float(t_opt["dataloader_timeout"]))
    if len(loader) < accum:
        raise ConfigError(f"an epoch has only {len(loader)} batch(es) per process, fewer than "
                          f"train.grad_accum_steps={accum}")
    per_process = loader.batch_size or 1
    global_batch = per_process * dist_info.world_size * accum
    descriptor = run_descriptor(opt, dist_info, per_process, accum)
    if on_ready is not None:
        on_ready()
    logger.info("Numerics: deterministic %s, TF32 %s, cuDNN benchmark %s, AMP %s, %d intra-op thread(s)",
                "on" if numerics["deterministic"] else "off", "on" if numerics["tf32"] else "off",
                "on" if numerics["cudnn_benchmark"] else "off", t_opt["amp"], torch.get_num_threads())
    if dist_info.device.type == "cuda" and dist_info.is_master:
        logger.info("Memory: %s", memory_plan.startup_line(opt, dist_info.device, dist_info.world_size, per_process))
    for caveat in numerics["caveats"]:
        logger.warning("Not reproducible: %s", caveat)
    logger.info("Random seed: %d", seed)
    logger.info("Number of train clips: %d, iters per epoch: %d", len(train_set), len(loader) // accum)
    if start_step:
        logger.info("Resuming from step %d (%s)", start_step, paths["models"])
        if world_change:
            logger.info(world_change)
        reasons = inexact_resume_reasons(train_state.get("run"), descriptor, t_opt["G_optimizer_reuse"])
        if reasons:
            logger.warning("Resume from step %d is not bit-exact: %s", start_step, "; ".join(reasons))
    ckpt.remove_stale_temporaries(paths["models"])

    tb = TensorBoardWriter(paths["tensorboard"])
    stop = StopRequest()
    stop.install()
    step, epoch = start_step, int(train_state.get("epoch", 0))
    items_done = _epoch_items(train_state, per_process)
    best = dict(train_state.get("best") or {"psnr": float("-inf"), "step": 0})
    summary: dict[str, Any] = {"stopped_by": None, "last_val": None}
    total = int(t_opt["total_iter"])
    val_every = t_opt["checkpoint_test"]
    last_saved = start_step
    window: list[float] = []
    timings = {"iter": 0.0, "data": 0.0, "n": 0}

    def state_for_save() -> dict[str, Any]:
        rng_all = [ckpt.capture_rng_state()]
        if utils_dist.is_dist():
            rng_all = [None] * dist_info.world_size
            torch.distributed.all_gather_object(rng_all, ckpt.capture_rng_state())
        return {"epoch": epoch, "items_in_epoch": items_done, "seed": seed, "rng": rng_all, "best": best,
                "run": descriptor}

    def run_validation() -> None:
        if test_set is None:
            return
        if not summary.get("baseline_logged"):
            net_opt = opt["netG"]
            vfi = is_frame_interpolation(net_opt)
            logger.info("Input baseline (the LQ input itself, bicubic-upsampled when scale > 1):")
            validate(InputBaseline(opt["scale"], vfi), test_set, step=step, epoch=epoch,
                     save_img=False, images_dir="", tb=None)
            summary["baseline_logged"] = True
        result = validate(model, test_set, step=step, epoch=epoch, save_img=opt["val"]["save_img"],
                          images_dir=paths["images"], tb=tb, tb_images=opt["val"]["tb_images"])
        summary["last_val"] = result
        if result is not None and result["psnr"] > best["psnr"]:
            best.update(psnr=result["psnr"], step=step)
        if result is not None:
            logger.info("Best PSNR: %.2f dB at step %d (%s)", best["psnr"], best["step"],
                        os.path.join(paths["models"], f"{best['step']}_G.pth"))

    def finish(stopped_by: str | None = None) -> dict[str, Any]:
        summary["stopped_by"] = stopped_by
        return {**summary, "step": step, "epoch": epoch, "best_psnr": best["psnr"], "best_step": best["step"]}

    try:
        sampler.set_position(epoch, items_done)
        if step >= total:
            logger.info("Training already finished: step %d of %d is complete in %s", step, total, paths["models"])
        elif stop.agreed():  # a worker started after the launcher forwarded a stop request
            logger.warning("A stop was requested before step %d: nothing to do; re-run the same command to continue",
                           step + 1)
            return finish(stop.signal_name or "a stop signal on another rank")
        while step < total:
            iterator = iter(loader)
            while step < total:
                t0 = time.perf_counter()
                batches = []
                for _ in range(accum):
                    batch = next_batch(iterator, loader.timeout)
                    if batch is None:
                        break
                    batches.append(batch)
                if len(batches) < accum:
                    break
                t_data = time.perf_counter() - t0
                items_done += global_batch
                step += 1
                model.update_learning_rate(step)
                model.train_step(batches, step)
                window.append(model.current_log()["G_loss"])
                timings["iter"] += time.perf_counter() - t0
                timings["data"] += t_data
                timings["n"] += 1
                if step % t_opt["checkpoint_print"] == 0 or step == total:
                    _log_step(model, window, timings, epoch, step, global_batch, dist_info, tb)
                    window, timings = [], {"iter": 0.0, "data": 0.0, "n": 0}
                if val_every and step % val_every == 0:
                    run_validation()
                stopping = stop.agreed()
                if (step % t_opt["checkpoint_save"] == 0 or step == total or stopping) and step != last_saved:
                    model.save(step, state_for_save())
                    last_saved = step
                if stopping:
                    stopped_by = stop.signal_name or "a stop signal on another rank"
                    logger.warning("Stopped by %s at step %d: checkpoint saved in %s; re-run the same command to "
                                   "continue", stopped_by, step, paths["models"])
                    return finish(stopped_by)
            else:
                break
            epoch += 1
            items_done = 0
            sampler.set_position(epoch, 0)
        logger.info("Finish training.")
    finally:
        stop.uninstall()
        tb.close()
    return finish()


def _log_step(model: Any, window: list[float], timings: dict[str, float], epoch: int, step: int,
              global_batch: int, dist_info: DistInfo, tb: TensorBoardWriter) -> None:
    n = max(timings["n"], 1)
    stats = utils_dist.reduce_mean_dict({"G_loss": sum(window) / max(len(window), 1),
                                        "sec_iter": timings["iter"] / n, "data_sec": timings["data"] / n})
    stats["samples_s"] = global_batch / max(stats["sec_iter"], 1e-9)
    stats["peak_mem_GB"] = peak_memory_gb(dist_info.device)
    lr = model.current_learning_rate()
    message = f"<epoch:{epoch:3d}, iter:{step:8,d}, lr:{lr:.3e}> "
    message += "".join(f"{k}: {v:.3e} " for k, v in stats.items())
    logger.info(message)
    tb.scalars({"train/" + k: v for k, v in stats.items()} | {"train/lr": lr}, step)


class InputBaseline:
    """Stands in for a model in :func:`validate`: the input itself as the restored video."""

    def __init__(self, scale: int, vfi: bool) -> None:
        self.scale, self.vfi = scale, vfi

    def infer(self, lq: torch.Tensor) -> torch.Tensor:
        frames = 1 if self.vfi else lq.shape[1]
        like = torch.empty(1, frames, 3, lq.shape[-2] * self.scale, lq.shape[-1] * self.scale)
        return input_baseline(lq, like)
