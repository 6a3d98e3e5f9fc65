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

Checkpoints add ``{step}_D.pth`` (``{'params': ...}``, spectral-norm vectors included) and ``{step}_optimizerD.pth``
beside G's files (KAIR's names), written before ``{step}_state.pth``, which also holds D's scheduler step.
The log carries KAIR's fields: ``G_loss`` (weighted pixel loss), ``F_loss`` (weighted perceptual loss),
``D_loss`` (G's weighted adversarial loss), ``D_real``/``D_fake`` (mean D logits on real and fake frames), plus
``l_d_real``/``l_d_fake`` (D's own losses).
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import os
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from models.loss import VGG19_SHA256_PREFIX, VGG19_URL, GANLoss, PerceptualLoss
from models.lr_scheduler import ClosedFormLR
from models.model_plain import OPTIMIZERS
from models.model_vrt import ModelVRT
from models.network_discriminator import define_D
from utils import utils_checkpoint as ckpt
from utils import utils_dist
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
        self.net_d: nn.Module = define_D(opt).to(self.device)
        self.net_d_train: nn.Module = self.net_d
        self.optimizer_d: torch.optim.Optimizer | None = None
        self.scheduler_d: ClosedFormLR | None = None
        self.perceptual: PerceptualLoss | None = None

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
        self.net_d.train()
        self.define_optimizer_d()
        self.wrap_d()

    def _d(self, key: str) -> Any:
        """``train.D_<key>``, or ``train.G_<key>`` when it is null (D follows G's setting)."""
        value = self.train_opt[f"D_{key}"]
        return self.train_opt[f"G_{key}"] if value is None else value

    def define_optimizer_d(self) -> None:
        t = self.train_opt
        cls = OPTIMIZERS[t["D_optimizer_type"]]
        self.optimizer_d = cls(self.net_d.parameters(), lr=t["D_optimizer_lr"], betas=tuple(self._d("optimizer_betas")),
                               weight_decay=t["D_optimizer_wd"])
        self.scheduler_d = ClosedFormLR(self.optimizer_d, self._d("scheduler_type"),
                                        periods=self._d("scheduler_periods"),
                                        restart_weights=self._d("scheduler_restart_weights"),
                                        eta_min=self._d("scheduler_eta_min"),
                                        milestones=self._d("scheduler_milestones"),
                                        gamma=self._d("scheduler_gamma"))

    def wrap_d(self) -> None:
        """Wrap D in DDP under a process group. Its buffers (the spectral-norm vectors) are synchronised once here
        and then evolve identically on every rank, so they are not re-sent before each forward."""
        if not self.dist.distributed:
            self.net_d_train = self.net_d
            return
        device_ids = [self.device.index] if self.device.type == "cuda" else None
        ddp_args = inspect.signature(DistributedDataParallel).parameters
        sync = "forward_sync_buffers" if "forward_sync_buffers" in ddp_args else "broadcast_buffers"
        self.net_d_train = DistributedDataParallel(self.net_d, device_ids=device_ids,
                                                   find_unused_parameters=self.opt["find_unused_parameters"],
                                                   **{sync: False})

    def update_learning_rate(self, step: int) -> None:
        super().update_learning_rate(step)
        if self.scheduler_d is not None:
            self.scheduler_d.set_step(step)

    # ----- training
    def _no_sync_d(self, last: bool) -> contextlib.AbstractContextManager:
        if not last and hasattr(self.net_d_train, "no_sync"):
            return self.net_d_train.no_sync()
        return contextlib.nullcontext()

    def _backward(self, loss: torch.Tensor) -> None:
        (self.scaler.scale(loss) if self.scaler is not None else loss).backward()

    def schedule(self, step: int) -> tuple[bool, bool]:
        """``(update G, update D)`` at ``step``."""
        if step <= self.warmup:
            return True, False
        return step % self.d_update_ratio == 0 and step > self.d_init_iters, True

    def train_step(self, batches: Sequence[dict[str, Any]], step: int) -> None:
        """One step of G and D over ``batches`` (see the module docstring)."""
        self.set_phase(step)
        update_g, update_d = self.schedule(step)
        self.optimizer.zero_grad(set_to_none=True)
        self.optimizer_d.zero_grad(set_to_none=True)
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
        n = len(batches)
        checked: list[torch.Tensor] = []
        fakes: list[torch.Tensor] = []
        self.net_d.requires_grad_(False)
        for i, data in enumerate(batches):
            lq = data["L"].to(self.device, non_blocking=True)
            gt = data["H"].to(self.device, non_blocking=True).float()
            with self._no_sync(last=i == n - 1) if update_g else contextlib.nullcontext():
                with self.autocast(), torch.set_grad_enabled(update_g):
                    out = (self.net_g_train if update_g else self.net_g)(lq)
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
                    self._backward(total / n)
            checked.append(total.detach())
            fakes.append(out.detach())
        return checked, fakes

    def _discriminator_pass(self, batches: Sequence[dict[str, Any]], fakes: list[torch.Tensor],
                            logs: dict[str, list[torch.Tensor]]) -> list[torch.Tensor]:
        """D over every micro-batch's GT and output together, one backward each (DDP syncs D's gradients on the
        last). Returns each micro-batch's ``l_d_real + l_d_fake``."""
        n = len(batches)
        checked: list[torch.Tensor] = []
        self.net_d.requires_grad_(True)
        for i, (data, fake) in enumerate(zip(batches, fakes)):
            gt = data["H"].to(self.device, non_blocking=True)
            with self._no_sync_d(last=i == n - 1):
                with self.autocast():
                    pred = self.net_d_train(torch.cat([gt.to(fake.dtype), fake])).float()
                pred_real, pred_fake = pred.chunk(2)
                l_real, l_fake = self.gan_loss.discriminator_loss(pred_real, pred_fake)
                self._backward((l_real + l_fake) / n)
            checked.append((l_real + l_fake).detach())
            for key, value in (("D_real", pred_real.mean()), ("D_fake", pred_fake.mean()), ("l_d_real", l_real),
                               ("l_d_fake", l_fake)):
                logs.setdefault(key, []).append(value.detach())
        return checked

    def optimizer_steps(self, update_g: bool, update_d: bool) -> None:
        """The G update (with ``G_optimizer_clipgrad``), the D update, the scaler update, then EMA (every step, as
        KAIR)."""
        clip = self.train_opt["G_optimizer_clipgrad"]
        scaler = self.scaler
        if update_g:
            if clip and clip > 0:
                if scaler is not None:
                    scaler.unscale_(self.optimizer)
                nn.utils.clip_grad_norm_(self.net_g.parameters(), clip)
            scaler.step(self.optimizer) if scaler is not None else self.optimizer.step()
        if update_d:
            scaler.step(self.optimizer_d) if scaler is not None else self.optimizer_d.step()
        if scaler is not None and (update_g or update_d):
            scaler.update()
        decay = self.train_opt["E_decay"]
        if decay > 0:
            self.update_E(decay)

    # ----- checkpoints
    @utils_dist.master_only
    def _write_checkpoint(self, step: int, train_state: dict[str, Any]) -> None:
        params = {k: v.detach().cpu() for k, v in self.net_d.state_dict().items()}
        ckpt.atomic_save({"params": params}, self._path(step, "D"))
        ckpt.atomic_save(self.optimizer_d.state_dict(), self._path(step, "optimizerD"))
        super()._write_checkpoint(step, dict(train_state, scheduler_D=self.scheduler_d.state_dict()))

    def _load_optimizer_d(self, path: str) -> None:
        """Moments from ``path``; hyper-parameters from the option file."""
        keep = ("initial_lr", "betas", "weight_decay", "eps")
        fresh = [{k: g[k] for k in keep if k in g} for g in self.optimizer_d.param_groups]
        self.optimizer_d.load_state_dict(ckpt.safe_load(path, map_location=self.device))
        for group, values in zip(self.optimizer_d.param_groups, fresh):
            group.update(values)

    def load_pretrained(self) -> None:
        """G's pretrained files, then ``path.pretrained_netD`` and ``pretrained_optimizerD`` (with
        ``train.D_optimizer_reuse``)."""
        super().load_pretrained()
        paths, t = self.opt["path"], self.train_opt
        for key in ("pretrained_netD", "pretrained_optimizerD"):
            if paths.get(key) and not os.path.isfile(paths[key]):
                raise ckpt.CheckpointError(f"path.{key} = {paths[key]!r} does not exist; point it at a .pth file "
                                           "or set it to null")
        if paths.get("pretrained_netD"):
            logger.info("Loading pretrained netD [%s]", paths["pretrained_netD"])
            ckpt.load_network(self.net_d, paths["pretrained_netD"], "params", strict=t["D_param_strict"])
        if paths.get("pretrained_optimizerD") and t["D_optimizer_reuse"]:
            logger.info("Loading pretrained optimizerD [%s]", paths["pretrained_optimizerD"])
            self._load_optimizer_d(paths["pretrained_optimizerD"])

    def resume(self, step: int) -> dict[str, Any]:
        """G's files (:meth:`ModelBase.resume`), then D, its optimizer (with ``train.D_optimizer_reuse``) and its
        scheduler step."""
        state = super().resume(step)
        path_d = self._path(step, "D")
        if not os.path.isfile(path_d):
            raise ckpt.CheckpointError(f"{path_d} is missing: step {step} of {self.models_dir} was not saved by "
                                       "model 'gan'; start the GAN stage as a new task with path.pretrained_netG")
        ckpt.load_network(self.net_d, path_d, "params", strict=True)
        opt_path = self._path(step, "optimizerD")
        if self.train_opt["D_optimizer_reuse"]:
            if not os.path.isfile(opt_path):  # a fresh optimizer would silently break the exact resume
                raise ckpt.CheckpointError(f"{opt_path} is missing: step {step} of {self.models_dir} is incomplete; "
                                           "restore the file, resume from another step, or set "
                                           "train.D_optimizer_reuse false to restart D's optimizer")
            self._load_optimizer_d(opt_path)
        else:
            logger.warning("Resume from step %d is not bit-exact: train.D_optimizer_reuse is false, so the "
                           "discriminator's optimizer state starts afresh (KAIR's meaning)", step)
        if state.get("scheduler_D"):
            self.scheduler_d.set_step(int(state["scheduler_D"]["step"]))
        return state
