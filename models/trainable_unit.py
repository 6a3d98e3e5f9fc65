"""A trainable unit: one network that trains, with what trains it (BasicSR keeps these as parallel lists).

A unit is the bare network (saved, loaded, evaluated), what its training forward goes through (the DDP and/or
``torch.compile`` wrapper, or the network itself), its optimizer, its closed-form LR schedule, its gradient
clipping and, for G, the EMA copy. Its label ``L`` names everything else, KAIR's way:

- checkpoint files: ``{step}_L.pth`` (``{'params': ...}``), ``{step}_optimizerL.pth``; the EMA copy
  ``{step}_E.pth`` (``{'params_ema': ...}``);
- option keys: ``train.L_optimizer_{type,lr,betas,wd}`` and ``train.L_scheduler_*`` (null or absent: the value of
  the unit it inherits from, G), ``train.L_optimizer_reuse``, ``train.L_param_strict``;
- pretrained files: ``path.pretrained_netL``, ``path.pretrained_optimizerL``; EMA: ``path.pretrained_netE`` with
  ``train.E_param_strict``.

:class:`models.model_base.ModelBase` holds the units and runs creation, wrapping, LR setting, saving, pretrained
loading and resuming over them; this module is what one unit does on its own.
"""

from __future__ import annotations

import contextlib
import copy
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from models.lr_scheduler import ClosedFormLR
from utils import utils_checkpoint as ckpt

OPTIMIZERS = {"adam": torch.optim.Adam, "adamw": torch.optim.AdamW}
# option values a restored optimizer takes from the option file, not from the checkpoint (the user may change them)
FRESH_GROUP_KEYS = ("initial_lr", "betas", "weight_decay", "eps")


@dataclass(eq=False)
class TrainableUnit:
    """One network that trains.

    Args:
        label: ``G``, ``D``, ...: its checkpoint files and option keys (see the module docstring).
        net: the bare network, on the training device.
        name: what messages call it (``generator``, ``discriminator``).
        inherit: the unit whose option values fill this unit's null or absent optimizer/scheduler keys (None: G).
        compile: its training forward goes through ``torch.compile``.
        clipgrad: clip its global gradient norm to this before each update (None or 0: off).
        ema_label: the label of its EMA copy's files and keys (``E``; None: it has none).
        ema_decay: ``E = decay * E + (1 - decay) * net`` after every step (0: no EMA copy).
    """

    label: str
    net: nn.Module
    name: str
    inherit: str | None = "G"
    compile: bool = False
    clipgrad: float | None = None
    ema_label: str | None = None
    ema_decay: float = 0.0

    def __post_init__(self) -> None:
        self.train_net: nn.Module = self.net
        self.ema: nn.Module | None = None
        self.optimizer: torch.optim.Optimizer | None = None
        self.scheduler: ClosedFormLR | None = None

    def option(self, train_opt: dict[str, Any], key: str) -> Any:
        """``train.<label>_<key>``, or the inherited unit's value when it is null or absent."""
        value = train_opt.get(f"{self.label}_{key}")
        if value is None and self.inherit:
            value = train_opt.get(f"{self.inherit}_{key}")
        return value

    # ----- set-up
    def build(self, param_groups: list[dict[str, Any]], train_opt: dict[str, Any]) -> None:
        """Train mode, the EMA copy, the optimizer over ``param_groups`` and its closed-form schedule."""
        self.net.train()
        if self.ema_decay > 0:
            self.ema = copy.deepcopy(self.net).eval().requires_grad_(False)
        opt = lambda key: self.option(train_opt, key)  # noqa: E731
        self.optimizer = OPTIMIZERS[opt("optimizer_type")](
            param_groups, lr=opt("optimizer_lr"), betas=tuple(opt("optimizer_betas")), weight_decay=opt("optimizer_wd"))
        self.scheduler = ClosedFormLR(self.optimizer, opt("scheduler_type"), periods=opt("scheduler_periods"),
                                      restart_weights=opt("scheduler_restart_weights"),
                                      eta_min=opt("scheduler_eta_min"), milestones=opt("scheduler_milestones"),
                                      gamma=opt("scheduler_gamma"))

    # ----- training
    def no_sync(self, last: bool) -> contextlib.AbstractContextManager:
        """DDP's gradient synchronisation off, except on the ``last`` micro-batch of a step."""
        if not last and hasattr(self.train_net, "no_sync"):
            return self.train_net.no_sync()
        return contextlib.nullcontext()

    def update(self, scaler: torch.amp.GradScaler | None) -> None:
        """Clip (gradients unscaled first under fp16) and take the optimizer step."""
        if self.clipgrad and self.clipgrad > 0:
            if scaler is not None:
                scaler.unscale_(self.optimizer)
            nn.utils.clip_grad_norm_(self.net.parameters(), self.clipgrad)
        if scaler is not None:
            scaler.step(self.optimizer)
        else:
            self.optimizer.step()

    @torch.no_grad()
    def update_ema(self, decay: float | None = None) -> None:
        """``E = decay * E + (1 - decay) * net`` over parameters (``decay``: default ``ema_decay``); buffers are
        copied. One multi-tensor kernel per dtype group instead of one launch per tensor (VRT has about 1,500
        parameter tensors); the values are those of ``lerp_``/``copy_`` tensor by tensor."""
        if self.ema is None:
            return
        decay = self.ema_decay if decay is None else decay
        params_e, params = list(self.ema.parameters()), [p.detach() for p in self.net.parameters()]
        if params_e:
            torch._foreach_lerp_(params_e, params, 1.0 - decay)
        buffers_e, buffers = list(self.ema.buffers()), list(self.net.buffers())
        if buffers_e:
            torch._foreach_copy_(buffers_e, buffers)

    # ----- files
    def checkpoint_files(self) -> list[tuple[str, Any]]:
        """``(label, object)`` of each file of this unit in a checkpoint: the network, its EMA copy, its
        optimizer."""
        cpu = lambda net: {k: v.detach().cpu() for k, v in net.state_dict().items()}  # noqa: E731
        files: list[tuple[str, Any]] = [(self.label, {"params": cpu(self.net)})]
        if self.ema is not None:
            files.append((self.ema_label, {"params_ema": cpu(self.ema)}))
        if self.optimizer is not None:
            files.append((f"optimizer{self.label}", self.optimizer.state_dict()))
        return files

    def load_optimizer(self, path: str) -> None:
        """Moments from ``path``; hyper-parameters from the option file.

        The file is read onto the CPU: ``Optimizer.load_state_dict`` moves each moment to its parameter's device and
        keeps the step counters where a fresh optimizer keeps them (on the CPU unless ``capturable``/``fused``). Read
        onto the GPU, the counters would stay there and a non-capturable Adam would then synchronise with the device
        for every parameter of every step after a resume.

        Raises:
            CheckpointError: the file holds another number of parameter groups.
        """
        fresh = [{k: g[k] for k in FRESH_GROUP_KEYS if k in g} for g in self.optimizer.param_groups]
        state = ckpt.safe_load(path)
        if len(state.get("param_groups", [])) != len(self.optimizer.param_groups):
            raise ckpt.CheckpointError(f"{path} holds {len(state.get('param_groups', []))} parameter group(s), the "
                                       f"{self.name}'s optimizer has {len(self.optimizer.param_groups)} (another "
                                       "fix_lr_mul / fix_keys setting?)")
        self.optimizer.load_state_dict(state)
        for group, values in zip(self.optimizer.param_groups, fresh):
            group.update(values)
