"""Losses: the pixel losses (Charbonnier, L1, L2, L2-sum, SSIM as 1 - SSIM, 5-D aware), and for the GAN model the
adversarial losses (:class:`GANLoss`) and the VGG19 perceptual loss (:class:`PerceptualLoss`)."""

from __future__ import annotations

import os
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from utils import utils_checkpoint as ckpt


class CharbonnierLoss(nn.Module):
    """``mean(sqrt((x - y)^2 + eps))`` with ``eps`` inside the square root, as in the reference.

    Args:
        eps: added to the squared difference (not squared itself); KAIR's recipes use 1e-9.
    """

    def __init__(self, eps: float = 1e-9) -> None:
        super().__init__()
        self.eps = eps

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.sqrt((x - y).pow(2) + self.eps).mean()


def _gaussian_window(size: int = 11, sigma: float = 1.5) -> torch.Tensor:
    coords = torch.arange(size, dtype=torch.float64) - size // 2
    g = torch.exp(-(coords**2) / (2 * sigma**2))
    g = g / g.sum()
    return (g[:, None] @ g[None, :]).float()


class SSIMLoss(nn.Module):
    """``1 - SSIM`` with an 11x11 Gaussian window (sigma 1.5), C1 = 0.01^2, C2 = 0.03^2, inputs in [0, 1].

    Accepts images ``(B, C, H, W)`` or videos ``(B, T, C, H, W)`` (frames are folded into the batch).
    """

    def __init__(self, window_size: int = 11, sigma: float = 1.5) -> None:
        super().__init__()
        self.register_buffer("window", _gaussian_window(window_size, sigma)[None, None], persistent=False)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        if x.dim() == 5:
            x, y = x.flatten(0, 1), y.flatten(0, 1)
        channels = x.shape[1]
        window = self.window.to(dtype=x.dtype).expand(channels, 1, -1, -1)
        pad = window.shape[-1] // 2

        def blur(t: torch.Tensor) -> torch.Tensor:
            return F.conv2d(t, window, padding=pad, groups=channels)

        c1, c2 = 0.01**2, 0.03**2
        mu_x, mu_y = blur(x), blur(y)
        var_x = blur(x * x) - mu_x.pow(2)
        var_y = blur(y * y) - mu_y.pow(2)
        cov = blur(x * y) - mu_x * mu_y
        ssim = ((2 * mu_x * mu_y + c1) * (2 * cov + c2)) / ((mu_x.pow(2) + mu_y.pow(2) + c1) * (var_x + var_y + c2))
        return 1.0 - ssim.mean()


LOSSES = {
    "l1": lambda train_opt: nn.L1Loss(),
    "l2": lambda train_opt: nn.MSELoss(),
    "l2sum": lambda train_opt: nn.MSELoss(reduction="sum"),
    "ssim": lambda train_opt: SSIMLoss(),
    "charbonnier": lambda train_opt: CharbonnierLoss(train_opt["G_charbonnier_eps"]),
}


def define_loss(train_opt: dict) -> nn.Module:
    """Build the pixel loss named by ``train.G_lossfn_type``."""
    name = train_opt["G_lossfn_type"]
    if name not in LOSSES:
        raise KeyError(f"train.G_lossfn_type={name!r} is unknown; valid: {sorted(LOSSES)}")
    return LOSSES[name](train_opt)


# ---------------------------------------------------------------------------------------------------------------
# adversarial losses (the GAN model)
# ---------------------------------------------------------------------------------------------------------------
GAN_TYPES = ("gan", "ragan", "lsgan", "hinge", "wgan", "softplusgan")


class GANLoss(nn.Module):
    """Adversarial losses on discriminator logits, KAIR's ``gan_type`` names plus ``hinge``.

    ``gan`` (vanilla, binary cross-entropy on logits) and ``ragan`` (relativistic average, the same criterion on
    differences from the other side's batch mean) as KAIR and ESRGAN; ``lsgan`` (squared error to 1/0); ``hinge``
    (D: ``relu(1 - real) + relu(1 + fake)``, G: ``-fake``); ``wgan`` and ``softplusgan`` as KAIR.

    Args:
        gan_type: one of :data:`GAN_TYPES`.
    """

    def __init__(self, gan_type: str = "gan") -> None:
        super().__init__()
        self.gan_type = gan_type.lower()
        if self.gan_type not in GAN_TYPES:
            raise KeyError(f"train.gan_type={gan_type!r} is unknown; valid: {', '.join(GAN_TYPES)}")

    def criterion(self, pred: torch.Tensor, target_is_real: bool, is_disc: bool = True) -> torch.Tensor:
        """Mean loss of logits ``pred`` (any shape) for the target side."""
        kind = self.gan_type
        if kind in ("gan", "ragan"):
            target = torch.full_like(pred, 1.0 if target_is_real else 0.0)
            return F.binary_cross_entropy_with_logits(pred, target)
        if kind == "lsgan":
            return (pred - (1.0 if target_is_real else 0.0)).pow(2).mean()
        if kind == "hinge":
            if not is_disc:
                return -pred.mean()
            return F.relu(1.0 - pred).mean() if target_is_real else F.relu(1.0 + pred).mean()
        if kind == "wgan":
            return -pred.mean() if target_is_real else pred.mean()
        return F.softplus(-pred).mean() if target_is_real else F.softplus(pred).mean()

    def generator_loss(self, fake: torch.Tensor, real: torch.Tensor | None = None) -> torch.Tensor:
        """The generator's adversarial loss (unweighted).

        Args:
            fake: D's logits on the generator's output (with the graph to the generator).
            real: D's logits on the ground truth, detached (``ragan`` only).
        """
        if self.gan_type == "ragan":
            return (self.criterion(real - fake.mean(0, keepdim=True), False)
                    + self.criterion(fake - real.mean(0, keepdim=True), True)) / 2
        return self.criterion(fake, True, is_disc=False)

    def discriminator_loss(self, real: torch.Tensor, fake: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The discriminator's losses ``(l_d_real, l_d_fake)``; it trains on their sum.

        Args:
            real: D's logits on the ground truth.
            fake: D's logits on the detached generator output.
        """
        if self.gan_type == "ragan":  # halves as KAIR (its loss is their mean)
            return (0.5 * self.criterion(real - fake.detach().mean(0, keepdim=True), True),
                    0.5 * self.criterion(fake - real.detach().mean(0, keepdim=True), False))
        return self.criterion(real, True), self.criterion(fake, False)


# ---------------------------------------------------------------------------------------------------------------
# perceptual loss (VGG19 features)
# ---------------------------------------------------------------------------------------------------------------
VGG19_URL = "https://download.pytorch.org/models/vgg19-dcbb9e9d.pth"
# torchvision names its files after the first 8 hex digits of their SHA-256 and torch.hub checks that prefix;
# the full digest is not published, so the download is checked against the same prefix.
VGG19_SHA256_PREFIX = "dcbb9e9d"


class VGGFeatureExtractor(nn.Module):
    """torchvision's VGG19 ``features`` (``torchvision.models.vgg19``: the same modules and state-dict names; its
    classifier is never materialised), truncated after the deepest requested layer, returning the outputs of the
    requested layers (before their ReLU for convolution indices, as KAIR and BasicSR) through
    ``torchvision.models.feature_extraction.create_feature_extractor``.

    Until :meth:`load_vgg19` the convolutions hold ``nn.Conv2d``'s default initialisation, drawn in order from the
    global generator for all 16 of VGG19 (the truncated ones too), as ``torchvision.models.vgg.make_layers`` does.

    Args:
        layers: indices into ``vgg19().features`` (e.g. 2, 7, 16, 25, 34 = conv1_2, conv2_2, conv3_4, conv4_4,
            conv5_4).
        use_input_norm: normalise [0, 1] input with the ImageNet mean and std.
        use_range_norm: map [-1, 1] input to [0, 1] first.
    """

    def __init__(self, layers: Sequence[int], use_input_norm: bool = True, use_range_norm: bool = False) -> None:
        super().__init__()
        from torchvision.models import vgg19
        from torchvision.models.feature_extraction import create_feature_extractor

        with torch.device("meta"):  # no 400 MB classifier, no initialisation that is overwritten anyway
            full = vgg19(weights=None).features
        bad = [i for i in layers if not 0 <= int(i) < len(full)]
        if bad or not layers:
            raise ValueError(f"train.F_feature_layer must be indices 0..{len(full) - 1} of VGG19's features, got "
                             f"{list(layers)}")
        full = full.to_empty(device="cpu")
        for module in full:
            if isinstance(module, nn.Conv2d):
                module.reset_parameters()
            elif isinstance(module, nn.ReLU):
                module.inplace = False  # a kept pre-activation output must not be overwritten by the next ReLU
        self.layers = sorted({int(i) for i in layers})
        self.features = full[: self.layers[-1] + 1]
        # the graph calls the modules of self.features (shared, not copied), so .to() and load_state_dict reach it;
        # kept out of the registered children so the state dict stays torchvision's ``features.*`` names
        object.__setattr__(self, "_extract", create_feature_extractor(
            self.features, return_nodes={str(i): str(i) for i in self.layers}))
        self.use_input_norm, self.use_range_norm = use_input_norm, use_range_norm
        self.register_buffer("mean", torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1), persistent=False)
        self.requires_grad_(False).eval()

    def load_vgg19(self, path: str) -> None:
        """Load the ``features.*`` tensors of a torchvision VGG19 state dict (``vgg19-dcbb9e9d.pth``) by name.

        Raises:
            FileNotFoundError: no file at ``path``.
            KeyError: the file lacks a needed tensor or one has the wrong shape.
        """
        if not os.path.isfile(path):
            raise FileNotFoundError(f"VGG19 weights not found at {path!r}; fetch them with `python "
                                    f"scripts/download_vgg.py --out {path}` (from {VGG19_URL})")
        state = ckpt.safe_load(path)
        own = self.features.state_dict()
        picked = {}
        for key, value in own.items():
            source = state.get(f"features.{key}")
            if source is None or source.shape != value.shape:
                found = "missing" if source is None else f"shape {tuple(source.shape)}"
                raise KeyError(f"{path} is not torchvision's VGG19: features.{key} is {found} (expected "
                               f"{tuple(value.shape)})")
            picked[key] = source
        self.features.load_state_dict(picked, strict=True)

    def train(self, mode: bool = True) -> VGGFeatureExtractor:
        """Always in eval mode (a fixed feature extractor)."""
        return super().train(False)

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        """``x``: (N, 3, H, W) -> the requested layers' outputs, in increasing layer order."""
        if self.use_range_norm:
            x = (x + 1.0) / 2.0
        if self.use_input_norm:
            x = (x - self.mean) / self.std
        outputs = self._extract(x)
        return [outputs[str(i)] for i in self.layers]


class PerceptualLoss(nn.Module):
    """``sum_i w_i * criterion(vgg_i(x), vgg_i(gt))`` over frames, KAIR's ``F_*`` options.

    Args:
        feature_layer: one VGG19 ``features`` index or a list of them (KAIR's ``F_feature_layer``).
        weights: one weight for every layer, or one per layer (KAIR's ``F_weights``).
        lossfn_type: ``l1`` or ``l2``.
        use_input_norm: ImageNet normalisation of the [0, 1] input.
        use_range_norm: the input is in [-1, 1].
    """

    def __init__(self, feature_layer: int | Sequence[int] = 34, weights: float | Sequence[float] = 1.0,
                 lossfn_type: str = "l1", use_input_norm: bool = True, use_range_norm: bool = False) -> None:
        super().__init__()
        layers = [feature_layer] if isinstance(feature_layer, int) else list(feature_layer)
        if len(set(layers)) != len(layers):
            raise ValueError(f"train.F_feature_layer repeats a layer: {layers}")
        per_layer = [float(weights)] * len(layers) if isinstance(weights, (int, float)) else list(weights)
        if len(per_layer) != len(layers):
            raise ValueError(f"train.F_weights has {len(per_layer)} value(s) for {len(layers)} layer(s) of "
                             "train.F_feature_layer; give one number or one per layer")
        order = sorted(range(len(layers)), key=lambda i: layers[i])
        self.weights = [per_layer[i] for i in order]  # in the extractor's (increasing) layer order
        if lossfn_type not in ("l1", "l2"):
            raise KeyError(f"train.F_lossfn_type={lossfn_type!r} is unknown; valid: l1, l2")
        self.criterion = nn.L1Loss() if lossfn_type == "l1" else nn.MSELoss()
        self.vgg = VGGFeatureExtractor(layers, use_input_norm, use_range_norm)

    def forward(self, x: torch.Tensor, gt: torch.Tensor) -> torch.Tensor:
        """``x``, ``gt``: (N, 3, H, W) or clips (B, T, 3, H, W) -> scalar loss (each frame through VGG)."""
        if x.dim() == 5:
            x, gt = x.flatten(0, 1), gt.flatten(0, 1)
        with torch.no_grad():
            gt_features = self.vgg(gt.detach())
        loss = x.new_zeros(())
        for weight, fx, fgt in zip(self.weights, self.vgg(x), gt_features):
            loss = loss + weight * self.criterion(fx.float(), fgt.float())
        return loss
