"""The perceptual loss's VGG19 features, built on torchvision's public API (``vgg19`` + ``create_feature_extractor``),
equal torchvision's VGG19 ``features`` run layer by layer, and follow the extractor's moves and dtype changes."""

from __future__ import annotations

import torch
from torchvision.models import vgg19

from models.loss import VGGFeatureExtractor


def _reference(state: dict[str, torch.Tensor], layers: list[int], x: torch.Tensor) -> list[torch.Tensor]:
    """torchvision's VGG19 ``features`` with ``state``, layer by layer, keeping the outputs of ``layers``."""
    with torch.device("meta"):
        features = vgg19(weights=None).features[: max(layers) + 1]
    features = features.to_empty(device="cpu")
    features.load_state_dict(state, strict=True)
    out = []
    for i, module in enumerate(features):
        x = torch.relu(x) if isinstance(module, torch.nn.ReLU) else module(x)  # never in place
        if i in layers:
            out.append(x)
    return out


def test_requested_layers_equal_torchvision_vgg19_run_layer_by_layer():
    torch.manual_seed(0)
    layers = [2, 7, 8, 16]  # conv1_2 and conv2_2 (pre-activation: the next ReLU must not touch them), a ReLU, conv3_4
    vgg = VGGFeatureExtractor([16, 2, 8, 7], use_input_norm=False)
    assert all(k.startswith("features.") for k in vgg.state_dict())  # torchvision's names (load_vgg19 reads them)
    x = torch.rand(1, 3, 24, 20)
    got = vgg(x)
    want = _reference({k.removeprefix("features."): v for k, v in vgg.state_dict().items()}, layers, x)
    assert len(got) == len(layers) and all(torch.equal(g, w) for g, w in zip(got, want))
    assert float(got[0].min()) < 0  # the conv1_2 output before its ReLU
    vgg.double()  # the feature graph calls the extractor's own modules: a conversion reaches it
    assert all(o.dtype == torch.float64 for o in vgg(x.double()))
