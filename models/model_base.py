"""ModelBase: the interface the training and evaluation flows use, and the trainable units it runs: device
placement, DDP wrapping, EMA, LR scheduling, checkpoint I/O, pretrained loading and resuming, once for every unit.

The flows call exactly: ``init_train()``, ``load_pretrained()`` or ``resume(step)``, then per step
``update_learning_rate(step)`` and ``train_step(batches, step)``, ``current_log()``, ``current_learning_rate()``,
``save(step, train_state)``, and ``infer(lq)`` for validation. KAIR's ``feed_data``/``optimize_parameters`` pair
became ``train_step`` (one step takes several micro-batches with gradient accumulation), its ``test``/
``current_visuals`` pair ``infer`` (which returns the restored clip).
"""

from __future__ import annotations

import abc
import contextlib
import inspect
import logging
import os
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from models.lr_scheduler import ClosedFormLR
from models.select_network import define_G
from models.trainable_unit import TrainableUnit
from utils import utils_checkpoint as ckpt
from utils import utils_dist
from utils.utils_dist import DistInfo

logger = logging.getLogger(__name__)


@contextlib.contextmanager
def evaluating(net: nn.Module) -> Iterator[nn.Module]:
    """``net`` in eval mode for the block (its previous mode restored after)."""
    was_training = net.training
    net.eval()
    try:
        yield net
    finally:
        net.train(was_training)


class ModelBase(abc.ABC):
    """Holds the trainable units by label (:class:`models.trainable_unit.TrainableUnit`): G, declared here, with
    its EMA copy; a subclass declares the networks that train beside it with :meth:`add_unit` and writes only its
    step and its losses. ``net_g``, ``net_g_train``, ``net_e``, ``optimizer`` and ``scheduler`` are G's.

    A network that trains beside G is one declaration. A flow teacher, say: its option keys ``train.T_*`` (declared
    in ``utils/utils_option_schema.py``; null takes G's value) and ``path.pretrained_netT`` /
    ``pretrained_optimizerT``; its files ``{step}_T.pth`` and ``{step}_optimizerT.pth``::

        class ModelFlowDistill(ModelVRT):
            def __init__(self, opt, dist_info):
                super().__init__(opt, dist_info)
                self.add_unit(TrainableUnit("T", define_flow(opt).to(self.device), "flow teacher"))

            def train_step(self, batches, step):
                ...  # forwards through self.units["T"].train_net and self.net_g_train, one backward
                self.step_units([self.units["G"], self.units["T"]])

    Its optimizer, schedule, DDP wrapper, LR setting, files, pretrained loading and resume then follow.

    Args:
        opt: parsed options (read-only).
        dist_info: this process's rank, world size and device.
    """

    def __init__(self, opt: dict[str, Any], dist_info: DistInfo) -> None:
        self.opt = opt
        self.dist = dist_info
        self.device = dist_info.device
        self.train_opt: dict[str, Any] = opt.get("train", {})
        self.models_dir: str = opt["path"]["models"]
        self.units: dict[str, TrainableUnit] = {}
        t = self.train_opt
        self.add_unit(TrainableUnit("G", define_G(opt).to(self.device), "generator", inherit=None,
                                    compile=t["compile"], clipgrad=t["G_optimizer_clipgrad"], ema_label="E",
                                    ema_decay=t["E_decay"]))
        self.scaler: torch.amp.GradScaler | None = None  # one for every unit (fp16)
        self.log_dict: dict[str, float] = {}

    def add_unit(self, unit: TrainableUnit) -> TrainableUnit:
        """Declare a network that trains (built, wrapped, scheduled, saved, loaded and resumed with the others)."""
        self.units[unit.label] = unit
        return unit

    # ----- G's parts under their usual names (the flows read net_g)
    @property
    def net_g(self) -> nn.Module:
        """The bare generator: saved, loaded, evaluated."""
        return self.units["G"].net

    @property
    def net_g_train(self) -> nn.Module:
        """What G's training forward goes through (DDP and/or ``torch.compile``, or ``net_g``)."""
        return self.units["G"].train_net

    @property
    def net_e(self) -> nn.Module | None:
        """G's EMA copy (None without EMA)."""
        return self.units["G"].ema

    @property
    def optimizer(self) -> torch.optim.Optimizer | None:
        return self.units["G"].optimizer

    @property
    def scheduler(self) -> ClosedFormLR | None:
        return self.units["G"].scheduler

    # ----- the interface the flows use
    @abc.abstractmethod
    def init_train(self) -> None:
        """Build the losses, then every unit's optimizer and scheduler (:meth:`init_units`)."""

    @abc.abstractmethod
    def train_step(self, batches: Sequence[dict[str, Any]], step: int) -> None:
        """One optimisation step: forward/backward every micro-batch (gradient accumulation), then one update.

        Args:
            batches: ``train.grad_accum_steps`` loader batches ``{'L': (B, T, C, h, w), 'H': (B, T', 3, H, W)}``.
            step: the step being taken (1-based).
        """

    @abc.abstractmethod
    def infer(self, lq: torch.Tensor) -> torch.Tensor:
        """Restore a clip with the evaluation network (EMA or bare, never through DDP).

        Args:
            lq: ``(B, T, C, h, w)`` in [0, 1], on any device.

        Returns:
            ``(B, T', 3, H, W)`` float32 on the CPU.
        """

    def current_log(self) -> dict[str, float]:
        """The numbers of the last step (``{'G_loss': ...}``), this rank's."""
        return dict(self.log_dict)

    # ----- set-up and wrapping
    def param_groups(self, unit: TrainableUnit) -> list[dict[str, Any]]:
        """Parameter groups of ``unit``'s optimizer (one group of its trainable parameters here)."""
        return [{"params": [p for p in unit.net.parameters() if p.requires_grad]}]

    def init_units(self) -> None:
        """Every unit in train mode with its EMA copy, optimizer and schedule, then wrapped for training."""
        for unit in self.units.values():
            unit.build(self.param_groups(unit), self.train_opt)
        self.wrap()

    def wrap(self, *labels: str) -> None:
        """(Re-)wrap the units ``labels`` (default: all): ``torch.compile`` where the unit asks, DDP under a process
        group, the bare network otherwise. No DataParallel."""
        for label in labels or tuple(self.units):
            unit = self.units[label]
            if self.opt["sync_bn"] and self.dist.distributed:
                unit.net = nn.SyncBatchNorm.convert_sync_batchnorm(unit.net)
            net = torch.compile(unit.net) if unit.compile else unit.net
            if self.dist.distributed:
                device_ids = [self.device.index] if self.device.type == "cuda" else None
                # DDP re-sends every buffer from rank 0 before each forward by default (~41 MB of constant int64
                # index tables for VRT 001; D's spectral-norm vectors, which evolve identically on every rank); only
                # running statistics (BatchNorm) change in training and need it. Buffers are still synchronised once
                # at wrapping (forward_sync_buffers; broadcast_buffers in older torch).
                running_stats = any(getattr(m, "track_running_stats", False) and getattr(m, "running_mean", None)
                                    is not None for m in unit.net.modules())
                ddp_args = inspect.signature(torch.nn.parallel.DistributedDataParallel).parameters
                sync = "forward_sync_buffers" if "forward_sync_buffers" in ddp_args else "broadcast_buffers"
                net = DistributedDataParallel(net, device_ids=device_ids,
                                              find_unused_parameters=self.opt["find_unused_parameters"],
                                              **{sync: running_stats})
            unit.train_net = net

    def eval_network(self) -> nn.Module:
        """The network used for inference: EMA when ``E_decay > 0``, else the bare generator."""
        return self.net_e if self.net_e is not None else self.net_g

    # ----- updates and learning rate
    def step_units(self, units: Sequence[TrainableUnit]) -> None:
        """Update ``units`` (each clipped as it asks), then the GradScaler once, then every EMA copy (every step,
        as KAIR, whether or not its network was updated)."""
        for unit in units:
            unit.update(self.scaler)
        if self.scaler is not None and units:
            self.scaler.update()
        for unit in self.units.values():
            unit.update_ema()

    def update_E(self, decay: float) -> None:
        """``E = decay * E + (1 - decay) * G`` (see :meth:`TrainableUnit.update_ema`)."""
        self.units["G"].update_ema(decay)

    def update_learning_rate(self, step: int) -> None:
        """Set every unit's LR of step ``step`` (closed form), before its update."""
        for unit in self.units.values():
            if unit.scheduler is not None:
                unit.scheduler.set_step(step)

    def current_learning_rate(self) -> float:
        """LR of G's parameter group 0 (as KAIR logs it)."""
        return self.optimizer.param_groups[0]["lr"] if self.optimizer is not None else 0.0

    def scaler_state(self) -> dict[str, Any] | None:
        return self.scaler.state_dict() if self.scaler is not None else None

    # ----- checkpoints
    def _path(self, step: int, label: str) -> str:
        return os.path.join(self.models_dir, f"{step}_{label}.pth")

    def save(self, step: int, train_state: dict[str, Any]) -> None:
        """Write every unit's files (``{step}_G/E/optimizerG.pth``, ``{step}_D/optimizerD.pth``, ...) and then
        ``{step}_state.pth`` (rank 0), then a barrier.

        Args:
            step: the completed optimisation step.
            train_state: loop state (epoch, sampler position, RNG of every rank, best metric); G's schedule and the
                scaler state are added here.
        """
        self._write_checkpoint(step, train_state)
        utils_dist.barrier()

    @utils_dist.master_only
    def _write_checkpoint(self, step: int, train_state: dict[str, Any]) -> None:
        for unit in self.units.values():
            for label, obj in unit.checkpoint_files():
                ckpt.atomic_save(obj, self._path(step, label))
        # every LR is the closed form of the step (resume sets it from `step`); G's schedule stays in the file
        state = dict(train_state, step=step, scheduler=self.scheduler.state_dict() if self.scheduler else None,
                     scaler=self.scaler_state())
        ckpt.atomic_save(state, self._path(step, "state"))
        logger.info("Saving the model. Step %d -> %s", step, self.models_dir)

    def load_pretrained(self) -> None:
        """Every unit's ``path.pretrained_net<L>``, its EMA copy's ``pretrained_netE`` (else a copy of G) and
        ``path.pretrained_optimizer<L>`` (with ``train.<L>_optimizer_reuse``). Used only when there is nothing to
        resume; every named file is checked before anything loads."""
        paths, t = self.opt["path"], self.train_opt
        for unit in self.units.values():
            ema = [f"pretrained_net{unit.ema_label}"] if unit.ema_label else []
            for key in (f"pretrained_net{unit.label}", *ema, f"pretrained_optimizer{unit.label}"):
                path = paths.get(key)
                if path and not os.path.isfile(path):
                    raise ckpt.CheckpointError(f"path.{key} = {path!r} does not exist; point it at a .pth file "
                                               "(e.g. a released model in model_zoo/) or set it to null")
        for unit in self.units.values():
            path = paths.get(f"pretrained_net{unit.label}")
            if path:
                logger.info("Loading pretrained net%s [%s]", unit.label, path)
                ckpt.load_network(unit.net, path, "params", strict=unit.option(t, "param_strict"))
            if unit.ema is not None:
                path = paths.get(f"pretrained_net{unit.ema_label}")
                if path:
                    logger.info("Loading pretrained net%s [%s]", unit.ema_label, path)
                    ckpt.load_network(unit.ema, path, "params_ema", strict=t[f"{unit.ema_label}_param_strict"])
                else:
                    unit.update_ema(0.0)
            path = paths.get(f"pretrained_optimizer{unit.label}")
            if path and unit.optimizer is not None:
                if not unit.option(t, "optimizer_reuse"):
                    logger.warning("path.pretrained_optimizer%s is set but train.%s_optimizer_reuse is false: the "
                                   "%s's optimizer starts afresh", unit.label, unit.label, unit.name)
                else:
                    logger.info("Loading pretrained optimizer%s [%s]", unit.label, path)
                    unit.load_optimizer(path)

    def resume(self, step: int) -> dict[str, Any]:
        """Restore every unit's network, EMA copy and optimizer (with ``train.<L>_optimizer_reuse``) of complete step
        ``step``, every LR at ``step``, and the scaler.

        Returns:
            The saved loop state (epoch, sampler position, RNG states, best metric).

        Raises:
            CheckpointError: a unit's file is missing (a step saved by another model, or an incomplete one).
        """
        t = self.train_opt
        for unit in self.units.values():
            path = self._path(step, unit.label)
            if not os.path.isfile(path):
                raise ckpt.CheckpointError(f"{path} is missing: step {step} of {self.models_dir} was not saved by "
                                           f"model '{self.opt.get('model')}' (no {unit.name}); start this stage as a "
                                           "new task with path.pretrained_netG")
            ckpt.load_network(unit.net, path, "params", strict=True)
            if unit.ema is not None:
                path = self._path(step, unit.ema_label)
                if os.path.isfile(path):
                    ckpt.load_network(unit.ema, path, "params_ema", strict=True)
                else:
                    unit.update_ema(0.0)
            if unit.optimizer is None:
                continue
            path = self._path(step, f"optimizer{unit.label}")
            if unit.option(t, "optimizer_reuse"):
                if not os.path.isfile(path):  # a fresh optimizer would silently break the exact resume
                    raise ckpt.CheckpointError(f"{path} is missing: step {step} of {self.models_dir} is incomplete; "
                                               "restore the file, resume from another step, or set "
                                               f"train.{unit.label}_optimizer_reuse false to restart the "
                                               f"{unit.name}'s optimizer")
                unit.load_optimizer(path)
            elif unit.label != "G":  # G's is among the reasons the loop logs (engine.resume.inexact_resume_reasons)
                logger.warning("Resume from step %d is not bit-exact: train.%s_optimizer_reuse is false, so the %s's "
                               "optimizer state starts afresh (KAIR's meaning)", step, unit.label, unit.name)
        self.update_learning_rate(step)
        state = ckpt.safe_load(self._path(step, "state"))
        if self.scaler is not None and state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])
        return state
