"""ModelBase: the interface the training and evaluation flows use, plus device placement, DDP wrapping, EMA,
checkpoint I/O and LR scheduling.

The flows call exactly: ``init_train()``, ``load_pretrained()`` or ``resume(step)``, then per step
``update_learning_rate(step)`` and ``train_step(batches, step)``, ``current_log()``, ``current_learning_rate()``,
``save(step, train_state)``, and ``infer(lq)`` for validation. KAIR's ``feed_data``/``optimize_parameters`` pair
became ``train_step`` (one step takes several micro-batches with gradient accumulation), its ``test``/
``current_visuals`` pair ``infer`` (which returns the restored clip).
"""

from __future__ import annotations

import abc
import contextlib
import copy
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
    """Holds the generator ``net_g`` (the bare network: saved, loaded, evaluated), ``net_g_train`` (what the
    training forward goes through: the DDP and/or ``torch.compile`` wrapper, or ``net_g`` itself) and the EMA copy
    ``net_e``.

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
        self.net_g: nn.Module = define_G(opt).to(self.device)
        self.net_g_train: nn.Module = self.net_g
        self.net_e: nn.Module | None = None
        self.optimizer: torch.optim.Optimizer | None = None
        self.scheduler: ClosedFormLR | None = None
        self.log_dict: dict[str, float] = {}

    # ----- the interface the flows use
    @abc.abstractmethod
    def init_train(self) -> None:
        """Build loss, optimizer and scheduler, and wrap for DDP."""

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

    # ----- devices and wrapping
    def wrap(self) -> None:
        """(Re-)wrap ``net_g`` in DDP under a process group; the bare network otherwise. No DataParallel."""
        net = self.net_g
        if self.opt["sync_bn"] and self.dist.distributed:
            net = nn.SyncBatchNorm.convert_sync_batchnorm(net)
            self.net_g = net
        if self.train_opt["compile"]:
            net = torch.compile(net)
        if self.dist.distributed:
            device_ids = [self.device.index] if self.device.type == "cuda" else None
            # DDP re-sends every buffer from rank 0 before each forward by default (~41 MB of constant int64 index
            # tables for VRT 001); only running statistics (BatchNorm) change in training and need it. Buffers are
            # still synchronised once at wrapping (forward_sync_buffers; broadcast_buffers in older torch).
            running_stats = any(getattr(m, "track_running_stats", False) and getattr(m, "running_mean", None)
                                is not None for m in self.net_g.modules())
            ddp_args = inspect.signature(torch.nn.parallel.DistributedDataParallel).parameters
            sync = "forward_sync_buffers" if "forward_sync_buffers" in ddp_args else "broadcast_buffers"
            net = DistributedDataParallel(net, device_ids=device_ids,
                                          find_unused_parameters=self.opt["find_unused_parameters"],
                                          **{sync: running_stats})
        self.net_g_train = net

    def eval_network(self) -> nn.Module:
        """The network used for inference: EMA when ``E_decay > 0``, else the bare generator."""
        return self.net_e if self.net_e is not None else self.net_g

    # ----- EMA
    def define_ema(self) -> None:
        if self.train_opt["E_decay"] > 0:
            self.net_e = copy.deepcopy(self.net_g).eval().requires_grad_(False)

    @torch.no_grad()
    def update_E(self, decay: float) -> None:
        """``E = decay * E + (1 - decay) * G`` over parameters; buffers are copied.

        One multi-tensor kernel per dtype group instead of one launch per tensor (VRT has about 1,500 parameter
        tensors); the values are those of ``lerp_``/``copy_`` tensor by tensor.
        """
        if self.net_e is None:
            return
        params_e, params_g = list(self.net_e.parameters()), [p.detach() for p in self.net_g.parameters()]
        if params_e:
            torch._foreach_lerp_(params_e, params_g, 1.0 - decay)
        buffers_e, buffers_g = list(self.net_e.buffers()), list(self.net_g.buffers())
        if buffers_e:
            torch._foreach_copy_(buffers_e, buffers_g)

    # ----- learning rate
    def update_learning_rate(self, step: int) -> None:
        """Set the LR of step ``step`` (closed form), before its update."""
        if self.scheduler is not None:
            self.scheduler.set_step(step)

    def current_learning_rate(self) -> float:
        """LR of parameter group 0 (as KAIR logs it)."""
        return self.optimizer.param_groups[0]["lr"] if self.optimizer is not None else 0.0

    # ----- checkpoints
    def _path(self, step: int, label: str) -> str:
        return os.path.join(self.models_dir, f"{step}_{label}.pth")

    def save(self, step: int, train_state: dict[str, Any]) -> None:
        """Write ``{step}_G/E/optimizerG.pth`` and then ``{step}_state.pth`` (rank 0), then a barrier.

        Args:
            step: the completed optimisation step.
            train_state: loop state (epoch, sampler position, RNG of every rank, best metric); the scheduler and
                scaler states are added here.
        """
        self._write_checkpoint(step, train_state)
        utils_dist.barrier()

    @utils_dist.master_only
    def _write_checkpoint(self, step: int, train_state: dict[str, Any]) -> None:
        to_cpu = {k: v.detach().cpu() for k, v in self.net_g.state_dict().items()}
        ckpt.atomic_save({"params": to_cpu}, self._path(step, "G"))
        if self.net_e is not None:
            ema = {k: v.detach().cpu() for k, v in self.net_e.state_dict().items()}
            ckpt.atomic_save({"params_ema": ema}, self._path(step, "E"))
        if self.optimizer is not None:
            ckpt.atomic_save(self.optimizer.state_dict(), self._path(step, "optimizerG"))
        state = dict(train_state, step=step, scheduler=self.scheduler.state_dict() if self.scheduler else None,
                     scaler=self.scaler_state())
        ckpt.atomic_save(state, self._path(step, "state"))
        logger.info("Saving the model. Step %d -> %s", step, self.models_dir)

    def scaler_state(self) -> dict[str, Any] | None:
        return None

    def load_scaler_state(self, state: dict[str, Any] | None) -> None:
        del state

    def load_pretrained(self) -> None:
        """Load ``path.pretrained_netG``/``pretrained_netE``/``pretrained_optimizerG`` (used only when there is
        nothing to resume; the optimizer state only with ``train.G_optimizer_reuse``)."""
        paths = self.opt["path"]
        for key in ("pretrained_netG", "pretrained_netE", "pretrained_optimizerG"):
            path = paths.get(key)
            if path and not os.path.isfile(path):
                raise ckpt.CheckpointError(f"path.{key} = {path!r} does not exist; point it at a .pth file "
                                           "(e.g. a released model in model_zoo/) or set it to null")
        if paths.get("pretrained_netG"):
            logger.info("Loading pretrained netG [%s]", paths["pretrained_netG"])
            ckpt.load_network(self.net_g, paths["pretrained_netG"], "params", strict=self.train_opt["G_param_strict"])
        if self.net_e is not None:
            if paths.get("pretrained_netE"):
                logger.info("Loading pretrained netE [%s]", paths["pretrained_netE"])
                ckpt.load_network(self.net_e, paths["pretrained_netE"], "params_ema",
                                  strict=self.train_opt["E_param_strict"])
            else:
                self.update_E(0.0)
        if paths.get("pretrained_optimizerG") and self.optimizer is not None:
            if not self.train_opt["G_optimizer_reuse"]:
                logger.warning("path.pretrained_optimizerG is set but train.G_optimizer_reuse is false: the optimizer "
                               "starts afresh")
            else:
                logger.info("Loading pretrained optimizerG [%s]", paths["pretrained_optimizerG"])
                self._load_optimizer(paths["pretrained_optimizerG"])

    def _load_optimizer(self, path: str) -> None:
        """Moments from ``path``; hyper-parameters from the option file (the user may have changed them)."""
        keep = ("initial_lr", "betas", "weight_decay", "eps")
        fresh = [{k: g[k] for k in keep if k in g} for g in self.optimizer.param_groups]
        state = ckpt.safe_load(path, map_location=self.device)
        if len(state.get("param_groups", [])) != len(self.optimizer.param_groups):
            raise ckpt.CheckpointError(f"{path} holds {len(state.get('param_groups', []))} parameter group(s), the "
                                       f"optimizer has {len(self.optimizer.param_groups)} (another fix_lr_mul / "
                                       "fix_keys setting?)")
        self.optimizer.load_state_dict(state)
        for group, values in zip(self.optimizer.param_groups, fresh):
            group.update(values)

    def resume(self, step: int) -> dict[str, Any]:
        """Restore weights, EMA, optimizer, scheduler and scaler of complete step ``step``.

        Returns:
            The saved loop state (epoch, sampler position, RNG states, best metric).
        """
        ckpt.load_network(self.net_g, self._path(step, "G"), "params", strict=True)
        if self.net_e is not None:
            path_e = self._path(step, "E")
            if os.path.isfile(path_e):
                ckpt.load_network(self.net_e, path_e, "params_ema", strict=True)
            else:
                self.update_E(0.0)
        opt_path = self._path(step, "optimizerG")
        if self.optimizer is not None and self.train_opt["G_optimizer_reuse"]:
            if not os.path.isfile(opt_path):  # a fresh optimizer would silently break the exact resume
                raise ckpt.CheckpointError(f"{opt_path} is missing: step {step} of {self.models_dir} is incomplete; "
                                           "restore the file, resume from another step, or set "
                                           "train.G_optimizer_reuse false to restart the optimizer")
            self._load_optimizer(opt_path)
        state = ckpt.safe_load(self._path(step, "state"))
        if self.scheduler is not None and state.get("scheduler"):
            self.scheduler.set_step(int(state["scheduler"]["step"]))
        self.load_scaler_state(state.get("scaler"))
        return state
