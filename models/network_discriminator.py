"""Discriminators of the GAN model (``model: gan``): the U-Net discriminator with spectral normalisation of
Real-ESRGAN (KAIR's ``discriminator_unet``), applied to every frame of a clip.

``DISCRIMINATORS`` maps ``netD.net_type`` to the class; ``define_D(opt)`` builds ``opt['netD']`` with its keys
passed to the constructor (KAIR's keys that configure its other discriminators are accepted and not passed on).

Spectral normalisation uses ``torch.nn.utils.parametrizations.spectral_norm``; its power-iteration vectors are the
buffers ``<conv>.parametrizations.weight.0._u``/``_v`` (saved in ``{step}_D.pth``). Unlike the usual set-up, a
forward never runs the power iteration: :meth:`UNetDiscriminatorSN.power_iteration` does, once per training step.
The result then does not depend on how many forwards a step takes (micro-batches of gradient accumulation, or the
processes of a DDP job), and every rank's vectors stay identical without being broadcast.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils import parametrize
from torch.nn.utils.parametrizations import spectral_norm

from models.layers_warp import resize_bilinear

logger = logging.getLogger(__name__)

INIT_TYPES = ("default", "orthogonal")


class UNetDiscriminatorSN(nn.Module):
    """U-Net discriminator with spectral normalisation (Real-ESRGAN's layout): ``conv0``; ``conv1``-``conv3``
    stride-2 down; ``conv4``-``conv6`` after x2 bilinear up, each added to the matching down feature (skip
    connections); ``conv7``, ``conv8``; ``conv9`` to one channel. Every convolution but ``conv0`` and ``conv9`` is
    spectrally normalised and has no bias. Output: a realness logit per pixel.

    Args:
        in_nc: input channels.
        base_nc: channels of the first level (doubled at each of the three down levels).
        skip_connection: add the down features to the up features.
        init_type: ``default`` (PyTorch's initialisation, as Real-ESRGAN) or ``orthogonal`` (KAIR's recipes:
            ``orthogonal_`` with gain ``init_gain``, zero biases).
        init_gain: gain of the ``orthogonal`` initialisation.
    """

    def __init__(self, in_nc: int = 3, base_nc: int = 64, skip_connection: bool = True, init_type: str = "default",
                 init_gain: float = 0.2) -> None:
        super().__init__()
        if init_type not in INIT_TYPES:
            raise ValueError(f"netD.init_type={init_type!r} is not supported; valid: {', '.join(INIT_TYPES)}")
        self.skip_connection = skip_connection
        c = base_nc
        self.conv0 = nn.Conv2d(in_nc, c, 3, 1, 1)
        convs = {
            "conv1": nn.Conv2d(c, c * 2, 4, 2, 1, bias=False),
            "conv2": nn.Conv2d(c * 2, c * 4, 4, 2, 1, bias=False),
            "conv3": nn.Conv2d(c * 4, c * 8, 4, 2, 1, bias=False),
            "conv4": nn.Conv2d(c * 8, c * 4, 3, 1, 1, bias=False),
            "conv5": nn.Conv2d(c * 4, c * 2, 3, 1, 1, bias=False),
            "conv6": nn.Conv2d(c * 2, c, 3, 1, 1, bias=False),
            "conv7": nn.Conv2d(c, c, 3, 1, 1, bias=False),
            "conv8": nn.Conv2d(c, c, 3, 1, 1, bias=False),
        }
        self.conv9 = nn.Conv2d(c, 1, 3, 1, 1)
        if init_type == "orthogonal":  # before spectral_norm, whose first power iterations read the weights
            for conv in (self.conv0, *convs.values(), self.conv9):
                nn.init.orthogonal_(conv.weight, gain=init_gain)
                if conv.bias is not None:
                    nn.init.zeros_(conv.bias)
        for name, conv in convs.items():
            self.add_module(name, spectral_norm(conv))
        self.train()

    @property
    def input_multiple(self) -> int:
        """Height and width must be multiples of this (three stride-2 levels)."""
        return 8

    def _normalised(self) -> list[nn.Module]:
        return [m for m in self.modules() if parametrize.is_parametrized(m, "weight")]

    def train(self, mode: bool = True) -> UNetDiscriminatorSN:
        """Set the mode; the spectral-norm parametrisations stay in eval mode, so that no forward runs a power
        iteration (see :meth:`power_iteration`)."""
        super().train(mode)
        for module in self._normalised():
            module.parametrizations.weight.eval()
        return self

    @torch.no_grad()
    def power_iteration(self) -> None:
        """One power-iteration step of every spectrally normalised convolution (updates the ``_u``/``_v`` buffers
        from the current weights). The GAN model calls it once per step, before the step's forwards."""
        for module in self._normalised():
            parametrization = module.parametrizations.weight
            parametrization.train()
            try:
                module.weight  # noqa: B018 - computing the weight in training mode runs the power method
            finally:
                parametrization.eval()

    def forward(self, x: Tensor) -> Tensor:
        """Realness logits.

        Args:
            x: frames ``(N, C, H, W)`` or clips ``(B, T, C, H, W)`` (each frame is judged on its own); H and W
                multiples of 8.

        Returns:
            ``(N, 1, H, W)``, or ``(B, T, 1, H, W)`` for clips.
        """
        clips = x.dim() == 5
        if clips:
            b, t = x.shape[:2]
            x = x.flatten(0, 1)
        h, w = x.shape[-2:]
        if h % 8 or w % 8:
            raise ValueError(f"the U-Net discriminator needs height and width divisible by 8, got {h}x{w} (choose "
                             "gt_size accordingly)")
        act = lambda t: F.leaky_relu(t, negative_slope=0.2)  # noqa: E731
        x0 = act(self.conv0(x))
        x1 = act(self.conv1(x0))
        x2 = act(self.conv2(x1))
        x3 = act(self.conv3(x2))
        x4 = act(self.conv4(resize_bilinear(x3, scale_factor=2, align_corners=False)))
        if self.skip_connection:
            x4 = x4 + x2
        x5 = act(self.conv5(resize_bilinear(x4, scale_factor=2, align_corners=False)))
        if self.skip_connection:
            x5 = x5 + x1
        x6 = act(self.conv6(resize_bilinear(x5, scale_factor=2, align_corners=False)))
        if self.skip_connection:
            x6 = x6 + x0
        out = self.conv9(act(self.conv8(act(self.conv7(x6)))))
        return out.unflatten(0, (b, t)) if clips else out


DISCRIMINATORS: dict[str, type[nn.Module]] = {
    "discriminator_unet": UNetDiscriminatorSN,
}

# KAIR netD keys that configure its other discriminators (PatchGAN) or BatchNorm: accepted, not passed on.
IGNORED_KEYS = ("net_type", "n_layers", "norm_type", "init_bn_type")


def define_D(opt: dict[str, Any]) -> nn.Module:
    """Build the discriminator described by ``opt['netD']`` (``net_type`` plus constructor arguments).

    Raises:
        KeyError: no ``netD`` section, or an unknown ``net_type`` (the message lists the registered ones).
    """
    opt_net = opt.get("netD")
    if not isinstance(opt_net, dict) or "net_type" not in opt_net:
        raise KeyError(f"model {opt.get('model')!r} needs a 'netD' section with a net_type, e.g. "
                       '"netD": {"net_type": "discriminator_unet", "base_nc": 64}')
    kind = str(opt_net["net_type"]).lower()
    if kind not in DISCRIMINATORS:
        raise KeyError(f"netD.net_type={opt_net['net_type']!r} is unknown; registered: {sorted(DISCRIMINATORS)}")
    kwargs = {k: v for k, v in opt_net.items() if k not in IGNORED_KEYS}
    net = DISCRIMINATORS[kind](**kwargs)
    logger.info("Discriminator %s: %.2f M parameters", type(net).__name__,
                sum(p.numel() for p in net.parameters()) / 1e6)
    return net
