"""LPIPS v0.1 (AlexNet, VGG16) and DISTS: the reference packages' definitions (``lpips`` 0.1.4, ``DISTS_pytorch``)
as our own forward on ``torchvision.models`` built without weights, loaded from checked files.

Why not call the packages: ``DISTS_pytorch.DISTS()`` downloads VGG16 in its constructor with no way around it, and
``lpips.LPIPS`` downloads its backbone unless told not to, neither with a checksum, an offline flag or rank-0
coordination; both would be run-time dependencies for some 60 lines of forward. Ours loads the same files (one VGG16
file serves LPIPS-VGG and DISTS), runs batched over frames on any device, and equals the packages within 1e-5
(tests/test_metrics_perceptual.py); benchmarks/bench_metrics.py measures both forwards (RESULTS.md).

All forwards take RGB in [0, 1]; the LPIPS package's own input is [-1, 1] (``normalize=True`` maps [0, 1] there).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torchvision.models import alexnet, vgg16
from torchvision.models.feature_extraction import create_feature_extractor

from utils.metrics.registry import MetricError

_EPS = 1e-10  # lpips.normalize_tensor
# backbone, the outputs LPIPS compares (relu1..relu5 of lpips.pretrained_networks), their channels
_LPIPS_NETS = {
    "alex": (alexnet, ("features.1", "features.4", "features.7", "features.9", "features.11"),
             (64, 192, 384, 256, 256)),
    "vgg": (vgg16, ("features.3", "features.8", "features.15", "features.22", "features.29"),
            (64, 128, 256, 512, 512)),
}


def _load_features(model: nn.Module, state: Mapping[str, torch.Tensor], what: str) -> None:
    """Load the ``features.*`` tensors of a torchvision state dict by name (the classifier is not used)."""
    own = model.features.state_dict()
    feats = {k[len("features."):]: v for k, v in state.items() if k.startswith("features.")}
    if set(feats) != set(own) or any(feats[k].shape != own[k].shape for k in own):
        raise MetricError(f"{what}: the file does not hold torchvision's {type(model).__name__} features "
                          f"(expected {sorted(own)[:3]}..., found {sorted(feats)[:3]}...)")
    model.features.load_state_dict(feats)


class LPIPS(nn.Module):
    """LPIPS v0.1: ``sum_l mean_hw(w_l . (phi_l(x)/|phi_l(x)| - phi_l(y)/|phi_l(y)|)^2)``.

    Args:
        net: ``'alex'`` or ``'vgg'``.
        backbone: torchvision's ImageNet state dict of that network (``features.*`` used).
        heads: the v0.1 linear heads (``lin{0..4}.model.1.weight``, as the lpips package stores them).
    """

    def __init__(self, net: str, backbone: Mapping[str, torch.Tensor], heads: Mapping[str, torch.Tensor]) -> None:
        super().__init__()
        build, nodes, chans = _LPIPS_NETS[net]
        model = build(weights=None)
        _load_features(model, backbone, f"LPIPS-{net} backbone")
        self.features = create_feature_extractor(model, return_nodes=list(nodes)).eval()
        self.nodes = nodes
        try:
            w = [heads[f"lin{i}.model.1.weight"].reshape(1, c) for i, c in enumerate(chans)]
        except (KeyError, RuntimeError) as err:
            raise MetricError(f"LPIPS-{net} heads: not the lpips v0.1 linear layers ({err})") from err
        self.register_buffer("heads", torch.cat(w, 1).reshape(-1).float(), persistent=False)
        self.chans = chans
        # lpips.ScalingLayer on [-1, 1] input, folded for [0, 1] input: (2x - 1 - shift) / scale
        self.register_buffer("shift", torch.tensor([-0.030, -0.088, -0.188]).view(1, 3, 1, 1), persistent=False)
        self.register_buffer("scale", torch.tensor([0.458, 0.448, 0.450]).view(1, 3, 1, 1), persistent=False)
        self.requires_grad_(False)

    def embed(self, x: torch.Tensor) -> list[torch.Tensor]:
        """Unit-normalised features of ``x`` (N, 3, H, W) RGB in [0, 1]: one (N, C_l, H_l, W_l) per layer."""
        out = self.features(((x * 2 - 1) - self.shift) / self.scale)
        return [f / (f.pow(2).sum(1, keepdim=True).sqrt() + _EPS) for f in (out[n] for n in self.nodes)]

    def distance(self, fa: list[torch.Tensor], fb: list[torch.Tensor]) -> torch.Tensor:
        """LPIPS of two lists of :meth:`embed` features with the same batch size -> (N,)."""
        # the 1x1 head commutes with the spatial mean: mean first is the same number at a fraction of the work
        pooled = torch.cat([(a - b).pow(2).mean((2, 3)) for a, b in zip(fa, fb)], 1)
        return pooled @ self.heads

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """``x``, ``y``: (N, 3, H, W) RGB in [0, 1] -> (N,) distances."""
        return self.distance(self.embed(x), self.embed(y))


class _L2Pool(nn.Module):
    """DISTS' replacement of VGG's max pooling: sqrt(Hann-3x3 * x^2), stride 2."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        a = np.hanning(5)[1:-1]
        g = torch.tensor(a[:, None] * a[None, :], dtype=torch.float32)
        self.register_buffer("filter", (g / g.sum()).expand(channels, 1, 3, 3).contiguous(), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (F.conv2d(x * x, self.filter, stride=2, padding=1, groups=x.shape[1]) + 1e-12).sqrt()


class DISTS(nn.Module):
    """DISTS: ``1 - sum_l sum_c (alpha_lc * S1_lc + beta_lc * S2_lc)`` over the input and five VGG16 stages (max
    pooling replaced by L2 pooling), S1 from channel means, S2 from variances and covariance (Ding et al. 2020).

    Args:
        backbone: torchvision's VGG16 ImageNet state dict (``features.*`` used).
        alpha_beta: ``{'alpha', 'beta'}``, each (1, 1475, 1, 1) (DISTS_pytorch's weights.pt).
    """

    CHANS = (3, 64, 128, 256, 512, 512)

    def __init__(self, backbone: Mapping[str, torch.Tensor], alpha_beta: Mapping[str, torch.Tensor]) -> None:
        super().__init__()
        model = vgg16(weights=None)
        _load_features(model, backbone, "DISTS VGG16 backbone")
        f = model.features
        cut = ((0, 4), (5, 9), (10, 16), (17, 23), (24, 30))  # the max pools at 4, 9, 16, 23 become L2 pools
        self.stages = nn.ModuleList(
            nn.Sequential(*([] if i == 0 else [_L2Pool(self.CHANS[i])]), *f[a:b]) for i, (a, b) in enumerate(cut))
        self.register_buffer("mean", torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1), persistent=False)
        try:
            alpha, beta = (alpha_beta[k].reshape(1, sum(self.CHANS)).float() for k in ("alpha", "beta"))
        except (KeyError, RuntimeError) as err:
            raise MetricError(f"DISTS weights: not DISTS_pytorch's alpha/beta ({err})") from err
        total = alpha.sum() + beta.sum()
        self.register_buffer("alpha", (alpha / total).reshape(-1), persistent=False)
        self.register_buffer("beta", (beta / total).reshape(-1), persistent=False)
        self.requires_grad_(False)

    def embed(self, x: torch.Tensor) -> list[torch.Tensor]:
        """The six feature maps DISTS compares: ``x`` itself and the five stage outputs."""
        feats, h = [x], (x - self.mean) / self.std
        for stage in self.stages:
            h = stage(h)
            feats.append(h)
        return feats

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """``x``, ``y``: (N, 3, H, W) RGB in [0, 1] -> (N,) distances."""
        c1 = c2 = 1e-6
        s1, s2 = [], []
        for a, b in zip(self.embed(x), self.embed(y)):
            ma, mb = a.mean((2, 3)), b.mean((2, 3))
            va, vb = (a - ma[..., None, None]).pow(2).mean((2, 3)), (b - mb[..., None, None]).pow(2).mean((2, 3))
            cov = (a * b).mean((2, 3)) - ma * mb
            s1.append((2 * ma * mb + c1) / (ma * ma + mb * mb + c1))
            s2.append((2 * cov + c2) / (va + vb + c2))
        return 1 - (torch.cat(s1, 1) @ self.alpha + torch.cat(s2, 1) @ self.beta)
