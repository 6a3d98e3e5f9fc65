"""The training loop: exactly ``total_iter`` steps, KAIR log lines, checkpoints, validation, resume, preemption."""

from __future__ import annotations

import logging
import os
import random
import resource
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from data.data_roots import missing_data_root
from data.select_dataset import define_Dataset
from engine.preemption import StopRequest
from engine.resume import (
    epoch_items,
    inexact_resume_reasons,
    rank_stream_seed,
    resolve_grad_accum,
    resume_step,
    run_descriptor,
)
from engine.schedule_check import schedule_notes
from engine.validate import Validation
from models import memory_plan
from models.net_io import InputMismatch, NetIO, net_io
from models.network_spynet import SPYNET_SHA256_PREFIX, SPYNET_URL
from models.select_model import define_Model
from utils import utils_checkpoint as ckpt
from utils import utils_dist, utils_numerics, utils_trackers
from utils.metrics import MetricError
from utils.utils_dataloader import build_train_loader, next_batch, seeded_rng
from utils.utils_dist import DistInfo
from utils.utils_download import ensure_file_on_rank0
from utils.utils_logger import TensorBoardWriter

logger = logging.getLogger(__name__)


class ConfigError(ValueError):
    """An option, dataset or network problem found while building the run."""


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


def fetch_weights(opt: dict[str, Any]) -> None:
    """Rank 0 fetches the official SpyNet weights when ``netG.spynet_path`` names a missing file (SHA-256-verified,
    atomic), then every rank goes on; the networks themselves never download.

    Raises:
        ConfigError: the file is missing and could not be downloaded (e.g. offline), on every rank.
    """
    path = opt["netG"].get("spynet_path")
    error = ensure_file_on_rank0(path, SPYNET_URL, SPYNET_SHA256_PREFIX) if path else None
    if error:
        raise ConfigError(f"netG.spynet_path = {path!r} is missing and could not be fetched: {error}")


def _build(opt: dict[str, Any], dist_info: DistInfo) -> tuple[Any, dict[str, Any], Any]:
    try:
        datasets = opt["datasets"]
        if "train" not in {k.split("_")[0] for k in datasets}:
            raise ConfigError("option 'datasets' needs a 'train' entry")
        train_key = train_key_of(opt)
        train_set = define_Dataset(datasets[train_key], run_dir=opt["path"]["task"])
        # every datasets.test* section is validated (e.g. `test` with ground truth and `test_footage`, your own
        # videos without); `test` keeps KAIR's lines
        test_sets = {k: define_Dataset(v) for k, v in datasets.items() if k.startswith("test")}
        model = define_Model(opt, dist_info)
        check_data_channels(net_io(model.net_g), test_sets)  # the training set: on its first batch
    except (KeyError, TypeError, ValueError) as exc:
        if isinstance(exc, ConfigError):
            raise
        msg = exc.args[0] if isinstance(exc, KeyError) and exc.args else str(exc)
        raise ConfigError(str(msg)) from exc
    return train_set, test_sets, model


def train_key_of(opt: dict[str, Any]) -> str:
    """The key of the training set in ``opt['datasets']`` (``train``, or KAIR's ``train_xxx``)."""
    return next(k for k in opt["datasets"] if k.startswith("train"))


def run_summary(opt: dict[str, Any], net: torch.nn.Module, sets: dict[str, Any]) -> list[str]:
    """The few lines a person reads on the console at the start of a run (the full options go to ``train.log`` and
    ``options/``): task, network and size, data, steps, where the log is."""
    io = net_io(net)
    params = sum(p.numel() for p in net.parameters())
    lines = [f"Task {opt['task']}: {opt['netG']['net_type']} ({params / 1e6:.2f}M parameters), "
             f"x{io.scale}, input {io.describe_input()} channels"]
    for key, data in sets.items():
        if data is None:
            continue
        d_opt = opt["datasets"].get(key, {})
        root = d_opt.get("dataroot_gt") or d_opt.get("dataroot_lq")
        lines.append(f"Data: datasets.{key} = {type(data).__name__}, {len(data)} clip(s)"
                     + (f" from {root}" if root else ""))
    t_opt = opt["train"]
    every = [f"{what} every {t_opt[key]}" for what, key in (("validation", "checkpoint_test"),
                                                            ("checkpoint", "checkpoint_save")) if t_opt[key]]
    lines.append(f"Steps: {t_opt['total_iter']}" + (f" ({', '.join(every)})" if every else "")
                 + f"; log: {os.path.join(opt['path']['log'], 'train.log')}; options: {opt['path']['options']}")
    return lines


def check_data_channels(io: NetIO, sets: dict[str | None, Any]) -> None:
    """Refuse, before any step, a data set whose input frames do not carry the channels the network reads (one
    item of each is made, under a fixed seed that leaves the global random streams as they were). The training set
    is checked on the first batch its loader delivers instead, where the loader's timeout and stall report apply.

    Raises:
        InputMismatch: naming the data set, both channel counts and what would fix it.
    """
    for key, data in sets.items():
        if data is None or not len(data):
            continue
        with seeded_rng(0):
            item = data[0]
        io.check_channels(int(item["L"].shape[1]), f"datasets.{key} ({type(data).__name__})")


def train_data_channels(io: NetIO, batch: dict[str, Any], train_opt: dict[str, Any]) -> None:
    """Refuse a training batch ``{'L': (N, T, C, h, w), ...}`` whose C is not what the network reads.

    Raises:
        ConfigError: one line naming the data set, both channel counts and what would fix it.
    """
    try:
        io.check_channels(int(batch["L"].shape[2]), f"datasets.train ({train_opt.get('dataset_type')})")
    except InputMismatch as exc:
        raise ConfigError(str(exc)) from exc


def train(opt: dict[str, Any], dist_info: DistInfo, on_ready: Callable[[], None] | None = None) -> dict[str, Any]:
    """Run (or resume) the training described by ``opt``.

    Args:
        opt: parsed options.
        dist_info: this process's place in the job.
        on_ready: called once everything is built and loaded, before the first file is written (``main`` opens
            the log file and saves the options there), so a run that fails on bad input leaves an existing
            experiment untouched.

    Returns:
        A summary: ``{'step', 'epoch', 'best_psnr', 'best_step', 'best', 'last_val', 'stopped_by'}`` (``best``:
        :meth:`engine.validate.BestSoFar.state`; ``best_step``: the step of ``val.best_metric``'s best).
    """
    numerics_before = utils_numerics.current_state()
    try:
        return _train(opt, dist_info, on_ready)
    finally:
        utils_numerics.restore_state(numerics_before)


def _train(opt: dict[str, Any], dist_info: DistInfo, on_ready: Callable[[], None] | None) -> dict[str, Any]:
    t_opt, paths = opt["train"], opt["path"]
    missing = missing_data_root(opt["datasets"])  # before anything is fetched, built or written
    if missing:
        raise ConfigError(missing)
    schedule_warnings, schedule_error = schedule_notes(opt)
    if schedule_error:
        raise ConfigError(schedule_error)
    numerics = utils_numerics.apply_policy(bool(t_opt["deterministic"]), bool(t_opt["tf32"]), dist_info.device)
    start_step = resume_step(opt)
    trackers = utils_trackers.create_trackers(opt)  # a missing package stops the run here
    seed = agree_seed(t_opt)
    seed_everything(seed)  # the same initial weights on every rank and in every run with this seed
    fetch_weights(opt)
    train_set, test_sets, model = _build(opt, dist_info)
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
    validation = None
    if test_sets:
        try:
            validation = Validation(opt, test_sets, dist_info.device, net_io(model.net_g), train_state.get("best"))
        except MetricError as exc:
            raise ConfigError(str(exc)) from exc
    tracker_ids = utils_trackers.start_trackers(trackers, train_state.get("trackers"), opt)
    if on_ready is not None:
        on_ready()
    for line in run_summary(opt, model.net_g, {train_key_of(opt): train_set, **test_sets}):
        logger.info("%s", line)
    for line in schedule_warnings:
        logger.warning("%s", line)
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

    tb = utils_trackers.RunLogger(TensorBoardWriter(paths["tensorboard"]), trackers)
    stop = StopRequest()
    stop.install()
    step, epoch = start_step, int(train_state.get("epoch", 0))
    items_done = epoch_items(train_state, per_process)
    summary: dict[str, Any] = {"stopped_by": None, "last_val": None}
    total = int(t_opt["total_iter"])

    def saved(at: int) -> bool:  # whether the checkpoint of step `at` is (or will be) written
        return (at % t_opt["checkpoint_save"] == 0 or at == total
                or os.path.isfile(os.path.join(paths["models"], f"{at}_G.pth")))

    if validation is not None and start_step:
        validation.write_best(saved)  # best.json as of the step resumed from
    val_every = t_opt["checkpoint_test"]
    last_saved = start_step
    window: list[dict[str, float]] = []
    timings = {"iter": 0.0, "data": 0.0, "n": 0}

    def state_for_save() -> dict[str, Any]:
        rng_all = [ckpt.capture_rng_state()]
        if utils_dist.is_dist():
            rng_all = [None] * dist_info.world_size
            torch.distributed.all_gather_object(rng_all, ckpt.capture_rng_state())
        best = validation.best.state() if validation is not None else train_state.get("best")
        return {"epoch": epoch, "items_in_epoch": items_done, "seed": seed, "rng": rng_all, "best": best,
                "run": descriptor, "trackers": tracker_ids}

    def run_validation() -> None:
        if validation is not None:
            summary["last_val"] = validation.run(model, step, epoch, tb, saved)

    def finish(stopped_by: str | None = None) -> dict[str, Any]:
        summary["stopped_by"] = stopped_by
        best = validation.best.state() if validation is not None else {"psnr": float("-inf"), "step": 0}
        return {**summary, "step": step, "epoch": epoch, "best_psnr": best["psnr"], "best_step": best["step"],
                "best": best}

    try:
        sampler.set_position(epoch, items_done)
        if step >= total:
            logger.info("Training already finished: step %d of %d is complete in %s", step, total, paths["models"])
        elif stop.agreed():  # a worker started after the launcher forwarded a stop request
            logger.warning("A stop was requested before step %d: nothing to do; re-run the same command to continue",
                           step + 1)
            return finish(stop.stopped_by or "a stop signal")
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
                if step == start_step:  # what the network eats, before its first step of this run
                    train_data_channels(net_io(model.net_g), batches[0], train_opt)
                t_data = time.perf_counter() - t0
                items_done += global_batch
                step += 1
                model.update_learning_rate(step)
                model.train_step(batches, step)
                window.append(model.current_log())
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
                    stopped_by = stop.stopped_by or "a stop signal"
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


def _log_step(model: Any, window: list[dict[str, float]], timings: dict[str, float], epoch: int, step: int,
              global_batch: int, dist_info: DistInfo, tb: utils_trackers.RunLogger) -> None:
    n = max(timings["n"], 1)
    fields: dict[str, list[float]] = {}  # the model's numbers (G_loss first), each over the steps that report it
    for entry in window:
        for key, value in entry.items():
            fields.setdefault(key, []).append(value)
    means = {key: sum(values) / len(values) for key, values in fields.items()}
    stats = utils_dist.reduce_mean_dict({**means, "sec_iter": timings["iter"] / n, "data_sec": timings["data"] / n})
    stats["samples_s"] = global_batch / max(stats["sec_iter"], 1e-9)
    stats["peak_mem_GB"] = peak_memory_gb(dist_info.device)
    lr = model.current_learning_rate()
    message = f"<epoch:{epoch:3d}, iter:{step:8,d}, lr:{lr:.3e}> "
    message += "".join(f"{k}: {v:.3e} " for k, v in stats.items())
    logger.info(message)
    tb.scalars({"train/" + k: v for k, v in stats.items()} | {"train/lr": lr}, step)
