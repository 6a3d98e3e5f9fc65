"""ModelGAN: perceptual and adversarial training of VRT/RVRT (``"model": "gan"``), with KAIR ``ModelGAN``'s options.

A step (KAIR's order and schedule, ``D_update_ratio``/``D_init_iters``):

1. the generator pass: every micro-batch through G; when G is updated this step, its loss is
   ``G_lossfn_weight * pixel + F_lossfn_weight * perceptual + D_lossfn_weight * adversarial`` (D frozen, judged
   frame by frame), backward with DDP gradient sync on the last micro-batch only;
2. the discriminator pass: every micro-batch's ground truth and (detached) output through D in one forward,
   ``l_d_real + l_d_fake``, one backward per micro-batch (so 2 processes average the same per-micro-batch
   gradients that 1 process accumulates);
3. one check that every loss of every rank is finite, then the G and D updates, then EMA.

G is updated at steps ``s > D_init_iters`` with ``s % D_update_ratio == 0`` (other steps train D alone, as KAIR);
``gan_warmup_iter`` steps first train G on the pixel and perceptual losses alone, D neither run nor updated.
G keeps ModelVRT's ``fix_iter`` phases. D's spectral-norm power iteration runs once per step, before its forwards
(``models.network_discriminator``).

D is a trainable unit (:class:`models.trainable_unit.TrainableUnit`, declared in the constructor): its optimizer
(``train.D_optimizer_*``), closed-form schedule (``train.D_scheduler_*``, null: G's), DDP wrapper, pretrained files
(``path.pretrained_netD``/``pretrained_optimizerD``), checkpoint files ``{step}_D.pth`` (``{'params': ...}``,
spectral-norm vectors included) and ``{step}_optimizerD.pth`` (KAIR's names, written before ``{step}_state.pth``)
and its resume are :class:`models.model_base.ModelBase`'s, as G's; this module holds the step and its losses.
The log carries KAIR's fields: ``G_loss`` (weighted pixel loss), ``F_loss`` (weighted perceptual loss),
``D_loss`` (G's weighted adversarial loss), ``D_real``/``D_fake`` (mean D logits on real and fake frames), plus
``l_d_real``/``l_d_fake`` (D's own losses).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from models.loss import VGG19_SHA256_PREFIX, VGG19_URL, GANLoss, PerceptualLoss
from models.model_vrt import ModelVRT
from models.network_discriminator import define_D
from models.trainable_unit import TrainableUnit
from utils.utils_dist import DistInfo
from utils.utils_download import ensure_file_on_rank0

logger = logging.getLogger(__name__)


def fetch_vgg19(path: str) -> None:
    """Rank 0 fetches torchvision's VGG19 weights to ``path`` when the file is missing (SHA-256-checked, atomic);
    every rank then goes on, or fails with the same one-line error.

    Raises:
        FileNotFoundError: the file is missing and could not be downloaded (e.g. offline), on every rank.
    """
    error = ensure_file_on_rank0(path, VGG19_URL, VGG19_SHA256_PREFIX)
    if error:
        raise FileNotFoundError(f"train.F_vgg19_path = {path!r} is missing and could not be fetched: {error}")


class ModelGAN(ModelVRT):
    """Pixel + VGG perceptual + adversarial training of the generator against a U-Net discriminator."""

    def __init__(self, opt: dict[str, Any], dist_info: DistInfo) -> None:
        super().__init__(opt, dist_info)
        self.add_unit(TrainableUnit("D", define_D(opt).to(self.device), "discriminator"))
        self.perceptual: PerceptualLoss | None = None

    @property
    def net_d(self) -> nn.Module:
        """The bare discriminator."""
        return self.units["D"].net

    # ----- set-up
    def init_train(self) -> None:
        t = self.train_opt
        self.gan_loss = GANLoss(t["gan_type"])
        self.d_weight = float(t["D_lossfn_weight"])
        self.f_weight = float(t["F_lossfn_weight"])
        self.d_update_ratio = max(1, int(t["D_update_ratio"]))
        self.d_init_iters = int(t["D_init_iters"])
        self.warmup = int(t["gan_warmup_iter"])
        if self.f_weight > 0:
            self.perceptual = PerceptualLoss(t["F_feature_layer"], t["F_weights"], t["F_lossfn_type"],
                                             t["F_use_input_norm"], t["F_use_range_norm"])
            fetch_vgg19(t["F_vgg19_path"])
            self.perceptual.vgg.load_vgg19(t["F_vgg19_path"])
            self.perceptual.to(self.device)
        super().init_train()

    # ----- training
    def schedule(self, step: int) -> tuple[bool, bool]:
        """``(update G, update D)`` at ``step``."""
        if step <= self.warmup:
            return True, False
        return step % self.d_update_ratio == 0 and step > self.d_init_iters, True

    def train_step(self, batches: Sequence[dict[str, Any]], step: int) -> None:
        """One step of G and D over ``batches`` (see the module docstring)."""
        self.set_phase(step)
        update_g, update_d = self.schedule(step)
        for unit in self.units.values():
            unit.optimizer.zero_grad(set_to_none=True)
        if update_d:
            self.net_d.power_iteration()
        logs: dict[str, list[torch.Tensor]] = {}
        checked, fakes = self._generator_pass(batches, update_g, update_d, logs)
        if update_d:
            checked += self._discriminator_pass(batches, fakes, logs)
        self.check_finite(torch.stack(checked), step)
        names = list(logs)
        means = torch.stack([torch.stack(logs[k]).double().mean() for k in names]).tolist()
        self.log_dict = dict(zip(names, means))
        self.optimizer_steps(update_g, update_d)

    def _generator_pass(self, batches: Sequence[dict[str, Any]], update_g: bool, update_d: bool,
                        logs: dict[str, list[torch.Tensor]]) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """G over every micro-batch, with its loss backward when ``update_g`` (D frozen; DDP syncs G's gradients
        on the last micro-batch). Returns each micro-batch's total loss and detached output ``(B, T', 3, H, W)``."""
        n, g = len(batches), self.units["G"]
        checked: list[torch.Tensor] = []
        fakes: list[torch.Tensor] = []
        self.net_d.requires_grad_(False)
        for i, data in enumerate(batches):
            lq = data["L"].to(self.device, non_blocking=True)
            gt = data["H"].to(self.device, non_blocking=True).float()
            with g.no_sync(last=i == n - 1) if update_g else contextlib.nullcontext():
                with self.autocast(), torch.set_grad_enabled(update_g):
                    out = (g.train_net if update_g else g.net)(lq)
                    pixel = self.lossfn_weight * self.lossfn(out.float(), gt)
                    total = pixel
                    logs.setdefault("G_loss", []).append(pixel.detach())
                    if update_g and self.perceptual is not None:
                        feat = self.f_weight * self.perceptual(out, gt)
                        total = total + feat
                        logs.setdefault("F_loss", []).append(feat.detach())
                    if update_g and update_d:
                        real = self.net_d(gt).float().detach() if self.gan_loss.gan_type == "ragan" else None
                        adv = self.d_weight * self.gan_loss.generator_loss(self.net_d(out).float(), real)
                        total = total + adv
                        logs.setdefault("D_loss", []).append(adv.detach())
                if update_g:
                    self.backward(total / n)
            checked.append(total.detach())
            fakes.append(out.detach())
        return checked, fakes

    def _discriminator_pass(self, batches: Sequence[dict[str, Any]], fakes: list[torch.Tensor],
                            logs: dict[str, list[torch.Tensor]]) -> list[torch.Tensor]:
        """D over every micro-batch's GT and output together, one backward each (DDP syncs D's gradients on the
        last). Returns each micro-batch's ``l_d_real + l_d_fake``."""
        n, d = len(batches), self.units["D"]
        checked: list[torch.Tensor] = []
        d.net.requires_grad_(True)
        for i, (data, fake) in enumerate(zip(batches, fakes)):
            gt = data["H"].to(self.device, non_blocking=True)
            with d.no_sync(last=i == n - 1):
                with self.autocast():
                    pred = d.train_net(torch.cat([gt.to(fake.dtype), fake])).float()
                pred_real, pred_fake = pred.chunk(2)
                l_real, l_fake = self.gan_loss.discriminator_loss(pred_real, pred_fake)
                self.backward((l_real + l_fake) / n)
            checked.append((l_real + l_fake).detach())
            for key, value in (("D_real", pred_real.mean()), ("D_fake", pred_fake.mean()), ("l_d_real", l_real),
                               ("l_d_fake", l_fake)):
                logs.setdefault(key, []).append(value.detach())
        return checked

    def optimizer_steps(self, update_g: bool, update_d: bool) -> None:
        """The G update (clipped with ``G_optimizer_clipgrad``), the D update, the scaler update, then EMA (every
        step, as KAIR)."""
        self.step_units([unit for unit, on in ((self.units["G"], update_g), (self.units["D"], update_d)) if on])
