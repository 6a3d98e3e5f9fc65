"""ModelVRT: the ``fix_iter``/``fix_keys``/``fix_lr_mul`` warm-up phases and tiled video inference (VRT and RVRT).

Semantics (KAIR's): parameters whose name contains any of ``fix_keys`` form their own parameter group with LR
``lr * fix_lr_mul`` for the whole run; before step ``fix_iter`` they are frozen (not updated). ``fix_iter: -1``
freezes nothing but keeps the multiplier.

Unlike KAIR, the phase change works under DDP without a static graph, a planned crash or a relabelled step:
the frozen parameters get ``requires_grad=False`` on the bare network *before* DDP wraps it, and at the first
step of the unfrozen phase the network is re-wrapped (a new reducer over the new set of trainable parameters).
Activation checkpointing is non-reentrant, so DDP needs neither ``static_graph`` nor ``find_unused_parameters``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import torch

from models.model_base import evaluating
from models.model_plain import ModelPlain
from models.net_io import net_io
from models.trainable_unit import TrainableUnit
from models.video_inference import infer_video, io_tiling

logger = logging.getLogger(__name__)


class ModelVRT(ModelPlain):
    """Training model for VRT/RVRT (``"model": "vrt"`` in the option file)."""

    def init_train(self) -> None:
        t = self.train_opt
        self.fix_iter = int(t["fix_iter"])
        self.fix_keys = list(t["fix_keys"])
        self.fix_lr_mul = float(t["fix_lr_mul"])
        self.frozen = False
        super().init_train()

    def _is_fixed(self, name: str) -> bool:
        return any(key in name for key in self.fix_keys)

    def param_groups(self, unit: TrainableUnit) -> list[dict[str, Any]]:
        """G's ``[normal, fixed]`` groups (KAIR's order) when ``fix_iter`` is set and ``fix_lr_mul != 1``."""
        if unit.label != "G":
            return super().param_groups(unit)
        named = list(unit.net.named_parameters())
        if not (self.fix_iter and self.fix_keys) or self.fix_lr_mul == 1:
            return [{"params": [p for _, p in named]}]
        lr = self.train_opt["G_optimizer_lr"]
        normal = [p for n, p in named if not self._is_fixed(n)]
        fixed = [p for n, p in named if self._is_fixed(n)]
        return [{"params": normal, "lr": lr}, {"params": fixed, "lr": lr * self.fix_lr_mul}]

    def set_phase(self, step: int) -> None:
        """Freeze ``fix_keys`` parameters for steps ``< fix_iter`` and unfreeze them at ``fix_iter``.

        Called before every step (and after a resume); re-wraps G's DDP when its trainable set changes.
        """
        want_frozen = bool(self.fix_keys) and self.fix_iter > 0 and step < self.fix_iter
        if want_frozen == self.frozen:
            return
        names = [n for n, _ in self.net_g.named_parameters() if self._is_fixed(n)]
        for name, param in self.net_g.named_parameters():
            if self._is_fixed(name):
                param.requires_grad_(not want_frozen)
        self.frozen = want_frozen
        verb = "Freeze" if want_frozen else "Unfreeze"
        logger.info("%s %d parameters matching %s at step %d", verb, len(names), self.fix_keys, step)
        self.wrap("G")

    def train_step(self, batches: Sequence[dict[str, Any]], step: int) -> None:
        self.set_phase(step)
        super().train_step(batches, step)

    # ----- tiled inference
    def infer(self, lq: torch.Tensor) -> torch.Tensor:
        """Tiled inference of a whole clip with the ``val`` options (see :meth:`ModelBase.infer`); tiles move to
        the training device (each temporal clip blended there), the output is assembled on the CPU."""
        val = self.opt["val"]
        with evaluating(self.eval_network()) as net, torch.inference_mode():
            io = net_io(net)
            # the val options' temporal tile and overlap, else the network's recommendation
            frames, overlap = io.temporal_tiling(val["num_frame_testing"], val["num_frame_overlapping"])
            return infer_video(
                net, lq, **io_tiling(io), num_frame_testing=frames,
                num_frame_overlapping=overlap, size_patch_testing=val["size_patch_testing"],
                overlap_size=val["overlap_size"], pad_seq=val["pad_seq"], flip_seq=val["flip_seq"],
                center_frame_only=val["center_frame_only"], device=self.device, autocast_dtype=self.amp_dtype)
