"""ModelPlain: one pixel-loss training step with AMP, gradient clipping and gradient accumulation."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from models.loss import define_loss
from models.lr_scheduler import ClosedFormLR
from models.model_base import ModelBase, evaluating
from utils import utils_checkpoint as ckpt
from utils import utils_dist
from utils.utils_dist import DistInfo
from utils.utils_numerics import AMP_DTYPES

logger = logging.getLogger(__name__)

OPTIMIZERS = {"adam": torch.optim.Adam, "adamw": torch.optim.AdamW}


class NonFiniteLossError(RuntimeError):
    """The loss became NaN or infinite; training stops and the last complete checkpoint stays as it is."""


class ModelPlain(ModelBase):
    """Train the generator with one pixel loss: ``loss = G_lossfn_weight * lossfn(net_g(L), H)``."""

    def __init__(self, opt: dict[str, Any], dist_info: DistInfo) -> None:
        super().__init__(opt, dist_info)
        self.amp_dtype = AMP_DTYPES[self.train_opt["amp"]]
        self.scaler: torch.amp.GradScaler | None = None

    # ----- set-up
    def init_train(self) -> None:
        self.net_g.train()
        self.define_ema()
        self.lossfn = define_loss(self.train_opt).to(self.device)
        self.lossfn_weight = float(self.train_opt["G_lossfn_weight"])
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
        cls = OPTIMIZERS[t["G_optimizer_type"]]
        self.optimizer = cls(self.param_groups(), lr=t["G_optimizer_lr"], betas=tuple(t["G_optimizer_betas"]),
                             weight_decay=t["G_optimizer_wd"])

    def define_scheduler(self) -> None:
        t = self.train_opt
        self.scheduler = ClosedFormLR(self.optimizer, t["G_scheduler_type"], periods=t["G_scheduler_periods"],
                                      restart_weights=t["G_scheduler_restart_weights"],
                                      eta_min=t["G_scheduler_eta_min"], milestones=t["G_scheduler_milestones"],
                                      gamma=t["G_scheduler_gamma"])

    def scaler_state(self) -> dict[str, Any] | None:
        return self.scaler.state_dict() if self.scaler is not None else None

    def load_scaler_state(self, state: dict[str, Any] | None) -> None:
        if self.scaler is not None and state:
            self.scaler.load_state_dict(state)

    # ----- training
    def autocast(self) -> contextlib.AbstractContextManager:
        if self.amp_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.amp_dtype)

    def _no_sync(self, last: bool) -> contextlib.AbstractContextManager:
        if not last and hasattr(self.net_g_train, "no_sync"):
            return self.net_g_train.no_sync()
        return contextlib.nullcontext()

    def train_step(self, batches: Sequence[dict[str, Any]], step: int) -> None:
        """Forward/backward each micro-batch (gradients synchronised on the last one only), then one update."""
        self.optimizer.zero_grad(set_to_none=True)
        losses = []
        for i, data in enumerate(batches):
            lq = data["L"].to(self.device, non_blocking=True)
            gt = data["H"].to(self.device, non_blocking=True)
            with self._no_sync(last=i == len(batches) - 1):
                with self.autocast():
                    out = self.net_g_train(lq)
                    loss = self.lossfn_weight * self.lossfn(out.float(), gt.float())
                scaled = loss / len(batches)
                (self.scaler.scale(scaled) if self.scaler is not None else scaled).backward()
            losses.append(loss.detach())
        self.log_dict["G_loss"] = self.check_finite(torch.stack(losses), step)
        self.optimizer_step()

    def check_finite(self, losses: torch.Tensor, step: int) -> float:
        """Stop every rank, before the update, when any rank's loss is NaN or infinite; returns this rank's mean
        loss. ``losses``: (n,) the step's micro-batch losses. Checked once per step, after the backward passes, so
        the host waits for the device once per step rather than between each forward and backward."""
        finite = torch.isfinite(losses).all().to(torch.float64)
        mean = losses.mean().to(torch.float64)
        if utils_dist.is_dist():
            ok, value = float(utils_dist.all_reduce_sum(finite) / utils_dist.get_world_size()), float(mean)
        else:
            ok, value = torch.stack([finite, mean]).tolist()
        if ok < 1.0:
            bad = losses[~torch.isfinite(losses)]
            last = ckpt.latest_complete_step(self.models_dir)
            where = f"step {last} in {self.models_dir}" if last else "none saved yet"
            raise NonFiniteLossError(f"non-finite loss ({float(bad[0]) if bad.numel() else value:.4g}) at step "
                                     f"{step}; the last complete checkpoint is {where} and is left untouched; lower "
                                     "train.G_optimizer_lr, set train.G_optimizer_clipgrad, or use train.amp=none")
        return value

    def optimizer_step(self) -> None:
        clip = self.train_opt["G_optimizer_clipgrad"]
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
        decay = self.train_opt["E_decay"]
        if decay > 0:
            self.update_E(decay)

    # ----- inference
    def infer(self, lq: torch.Tensor) -> torch.Tensor:
        """Whole-clip inference with the EMA or bare network (see :meth:`ModelBase.infer`)."""
        with evaluating(self.eval_network()) as net, torch.inference_mode(), self.autocast():
            return net(lq.to(self.device)).float().cpu()
