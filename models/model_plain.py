"""ModelPlain: one pixel-loss training step with AMP, gradient clipping and gradient accumulation."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Sequence
from typing import Any

import torch

from models.loss import define_loss
from models.model_base import ModelBase, evaluating
from utils import utils_checkpoint as ckpt
from utils import utils_dist
from utils.utils_dist import DistInfo
from utils.utils_numerics import AMP_DTYPES

logger = logging.getLogger(__name__)


class NonFiniteLossError(RuntimeError):
    """The loss became NaN or infinite; training stops and the last complete checkpoint stays as it is."""


class ModelPlain(ModelBase):
    """Train the generator with one pixel loss: ``loss = G_lossfn_weight * lossfn(net_g(L), H)``."""

    def __init__(self, opt: dict[str, Any], dist_info: DistInfo) -> None:
        super().__init__(opt, dist_info)
        self.amp_dtype = AMP_DTYPES[self.train_opt["amp"]]

    # ----- set-up
    def init_train(self) -> None:
        self.lossfn = define_loss(self.train_opt).to(self.device)
        self.lossfn_weight = float(self.train_opt["G_lossfn_weight"])
        if self.amp_dtype is torch.float16:
            self.scaler = torch.amp.GradScaler(self.device.type)
        self.init_units()

    # ----- training
    def autocast(self) -> contextlib.AbstractContextManager:
        if self.amp_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.amp_dtype)

    def backward(self, loss: torch.Tensor) -> None:
        """``loss.backward()``, scaled under fp16."""
        (self.scaler.scale(loss) if self.scaler is not None else loss).backward()

    def train_step(self, batches: Sequence[dict[str, Any]], step: int) -> None:
        """Forward/backward each micro-batch (gradients synchronised on the last one only), then one update."""
        g = self.units["G"]
        g.optimizer.zero_grad(set_to_none=True)
        losses = []
        for i, data in enumerate(batches):
            lq = data["L"].to(self.device, non_blocking=True)
            gt = data["H"].to(self.device, non_blocking=True)
            with g.no_sync(last=i == len(batches) - 1):
                with self.autocast():
                    out = g.train_net(lq)
                    loss = self.lossfn_weight * self.lossfn(out.float(), gt.float())
                self.backward(loss / len(batches))
            losses.append(loss.detach())
        self.log_dict["G_loss"] = self.check_finite(torch.stack(losses), step)
        self.step_units([g])

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

    # ----- inference
    def infer(self, lq: torch.Tensor) -> torch.Tensor:
        """Whole-clip inference with the EMA or bare network (see :meth:`ModelBase.infer`)."""
        with evaluating(self.eval_network()) as net, torch.inference_mode(), self.autocast():
            return net(lq.to(self.device)).float().cpu()
