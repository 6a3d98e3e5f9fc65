"""ModelPlain: one pixel-loss training step with AMP, gradient clipping and gradient accumulation."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from models.loss import define_loss
from models.lr_scheduler import ClosedFormLR
from models.model_base import ModelBase
from utils import utils_checkpoint as ckpt
from utils import utils_dist
from utils.utils_dist import DistInfo

logger = logging.getLogger(__name__)

AMP_DTYPES = {"none": None, "bf16": torch.bfloat16, "fp16": torch.float16}


class NonFiniteLossError(RuntimeError):
    """The loss became NaN or infinite; training stops and the last complete checkpoint stays as it is."""


class ModelPlain(ModelBase):
    """Train ``netG`` with one pixel loss: ``E = netG(L)``, ``loss = w * lossfn(E, H)``."""

    def __init__(self, opt: dict[str, Any], dist_info: DistInfo) -> None:
        super().__init__(opt, dist_info)
        self.amp_dtype = AMP_DTYPES[self.train_opt.get("amp", "none")]
        self.scaler: torch.amp.GradScaler | None = None
        self.accum_steps = int(self.train_opt.get("grad_accum_steps", 1))
        self.L: torch.Tensor | None = None
        self.H: torch.Tensor | None = None
        self.E: torch.Tensor | None = None

    # ----- set-up
    def init_train(self) -> None:
        self.net_g.train()
        self.define_ema()
        self.lossfn = define_loss(self.train_opt).to(self.device)
        self.lossfn_weight = float(self.train_opt.get("G_lossfn_weight", 1.0))
        self.define_optimizer()
        self.define_scheduler()
        if self.amp_dtype is torch.float16:
            self.scaler = torch.amp.GradScaler(self.device.type)
        self.wrap()

    def param_groups(self) -> list[dict[str, Any]]:
        """Parameter groups for the optimizer (one group of trainable parameters here)."""
        return [{"params": [p for p in self.net_g.parameters() if p.requires_grad]}]

    def define_optimizer(self) -> None:
        t = self.train_opt
        kind = t.get("G_optimizer_type", "adam").lower()
        cls = {"adam": torch.optim.Adam, "adamw": torch.optim.AdamW}.get(kind)
        if cls is None:
            raise KeyError(f"train.G_optimizer_type={kind!r} is unknown; valid: adam, adamw")
        self.optimizer = cls(self.param_groups(), lr=t.get("G_optimizer_lr", 2e-4),
                             betas=tuple(t.get("G_optimizer_betas", (0.9, 0.999))),
                             weight_decay=t.get("G_optimizer_wd", 0))

    def define_scheduler(self) -> None:
        t = self.train_opt
        self.scheduler = ClosedFormLR(self.optimizer, t.get("G_scheduler_type", "CosineAnnealingWarmRestarts"),
                                      periods=t.get("G_scheduler_periods") or t.get("total_iter", 1),
                                      restart_weights=t.get("G_scheduler_restart_weights", 1),
                                      eta_min=t.get("G_scheduler_eta_min", 0),
                                      milestones=t.get("G_scheduler_milestones", ()),
                                      gamma=t.get("G_scheduler_gamma", 0.5))

    def scaler_state(self) -> dict[str, Any] | None:
        return self.scaler.state_dict() if self.scaler is not None else None

    def load_scaler_state(self, state: dict[str, Any] | None) -> None:
        if self.scaler is not None and state:
            self.scaler.load_state_dict(state)

    def load_resume(self, step: int) -> dict[str, Any]:
        if not self.train_opt.get("G_optimizer_reuse", False):
            optimizer, self.optimizer = self.optimizer, None
            state = super().load_resume(step)
            self.optimizer = optimizer
            return state
        return super().load_resume(step)

    # ----- data and steps
    def feed_data(self, data: dict[str, Any], need_H: bool = True) -> None:
        """Keep ``L`` (and ``H``) of a batch on the training device (non-blocking from pinned memory)."""
        self.L = data["L"].to(self.device, non_blocking=True)
        self.H = data["H"].to(self.device, non_blocking=True) if need_H and "H" in data else None

    def autocast(self) -> contextlib.AbstractContextManager:
        if self.amp_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.amp_dtype)

    def _no_sync(self, last: bool) -> contextlib.AbstractContextManager:
        if not last and hasattr(self.netG, "no_sync"):
            return self.netG.no_sync()
        return contextlib.nullcontext()

    def train_micro_batches(self, batches: Iterator[dict[str, Any]], step: int) -> None:
        """Forward/backward ``grad_accum_steps`` micro-batches, then one optimizer update for ``step``.

        Args:
            batches: yields exactly ``grad_accum_steps`` loader batches.
            step: the optimisation step being taken (1-based).
        """
        self.optimizer.zero_grad(set_to_none=True)
        losses = []
        for i, data in enumerate(batches):
            self.feed_data(data)
            last = i == self.accum_steps - 1
            with self._no_sync(last):
                with self.autocast():
                    self.E = self.netG(self.L)
                    loss = self.lossfn_weight * self.lossfn(self.E.float(), self.H.float())
                self.check_finite(loss, step)
                scaled = loss / self.accum_steps
                (self.scaler.scale(scaled) if self.scaler is not None else scaled).backward()
            losses.append(loss.detach())
        self.optimizer_step(step)
        self.log_dict["G_loss"] = float(torch.stack(losses).mean())

    def optimize_parameters(self, step: int) -> None:
        """One step on the batch given to :meth:`feed_data` (no accumulation)."""
        data = {"L": self.L, "H": self.H}
        self.train_micro_batches(iter([data] * self.accum_steps), step)

    def check_finite(self, loss: torch.Tensor, step: int) -> None:
        """Stop every rank when any rank's loss is NaN or infinite."""
        flag = torch.isfinite(loss.detach()).all().to(torch.float64)
        if utils_dist.is_dist():
            flag = utils_dist.all_reduce_sum(flag) / utils_dist.get_world_size()
        if float(flag) < 1.0:
            last = ckpt.latest_complete_step(self.models_dir)
            where = f"step {last} in {self.models_dir}" if last else "none saved yet"
            raise NonFiniteLossError(f"non-finite loss ({float(loss.detach()):.4g}) at step {step}; the last complete "
                                     f"checkpoint is {where} and is left untouched; lower train.G_optimizer_lr, set "
                                     "train.G_optimizer_clipgrad, or use train.amp=none")

    def optimizer_step(self, step: int) -> None:
        clip = self.train_opt.get("G_optimizer_clipgrad")
        if self.scaler is not None:
            if clip and clip > 0:
                self.scaler.unscale_(self.optimizer)
                nn.utils.clip_grad_norm_(self.net_g.parameters(), clip)
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            if clip and clip > 0:
                nn.utils.clip_grad_norm_(self.net_g.parameters(), clip)
            self.optimizer.step()
        decay = self.train_opt.get("E_decay", 0)
        if decay > 0:
            self.update_E(decay)

    # ----- inference
    def infer(self, lq: torch.Tensor, net: nn.Module | None = None) -> torch.Tensor:
        """Whole-clip inference.

        Args:
            lq: ``(B, D, C, h, w)`` in [0, 1] on any device.
            net: the network (default: EMA or bare generator; never the DDP wrapper).

        Returns:
            The restored clip, float32 on the CPU.
        """
        net = net if net is not None else self.eval_network()
        was_training = net.training
        net.eval()
        try:
            with torch.inference_mode(), self.autocast():
                return net(lq.to(self.device)).float().cpu()
        finally:
            net.train(was_training)

    def test(self) -> None:
        self.E = self.infer(self.L)

    def current_visuals(self) -> dict[str, torch.Tensor]:
        out = {"L": self.L[0].detach().float().cpu(), "E": self.E[0].detach().float().cpu()}
        if self.H is not None:
            out["H"] = self.H[0].detach().float().cpu()
        return out
