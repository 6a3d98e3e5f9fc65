"""The weight files of the perceptual metrics: where each comes from, its SHA-256, the folder it lives in, and the
rank-0 fetch (as the perceptual loss's VGG19, through :mod:`utils.utils_download`).

Files live in one folder, ``model_zoo/metrics/`` by default (option ``path.metric_weights``, ``main_test_vrt.py
--metric_weights``, ``scripts/download_metric_weights.py --dir``), under the names below, so an offline machine gets
a copy of that folder. Every file is SHA-256-checked when it is loaded (metric values are only comparable with the
published weights); :class:`MetricError` names the file, the URL and the flag when one is missing offline.

Where each digest comes from (the files cannot be downloaded on the machine that wrote this):
- ``alexnet``, ``vgg16``: torchvision's ImageNet weights; torch.hub names them ``<name>-<first 8 hex digits of the
  SHA-256>.pth`` and checks that prefix, so the prefix is the published digest (the full one is not published).
- ``lpips_alex``, ``lpips_vgg``: the v0.1 linear heads, hashed from the ``lpips`` 0.1.4 wheel and from
  ``lpips/weights/v0.1/*.pth`` of github.com/richzhang/PerceptualSimilarity (the same bytes).
- ``dists``: alpha/beta of DISTS, hashed from the ``DISTS_pytorch`` 0.1 wheel and from ``DISTS_pytorch/weights.pt``
  of github.com/dingkeyan93/DISTS (the same bytes).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch

from utils.metrics.registry import MetricError, MetricSpec
from utils.utils_download import ensure_file_on_rank0, sha256_of

DEFAULT_WEIGHTS_DIR = "model_zoo/metrics"
FLAG = "path.metric_weights (option) / --metric_weights (main_test_vrt.py)"


@dataclass(frozen=True)
class WeightFile:
    """One weight file: ``filename`` in the weights folder, fetched from ``url``, checked against ``sha256`` (the
    full digest, or the 8-digit prefix torch.hub publishes)."""

    key: str
    filename: str
    url: str
    sha256: str
    what: str


_GH = "https://raw.githubusercontent.com"
WEIGHTS: dict[str, WeightFile] = {w.key: w for w in (
    WeightFile("alexnet", "alexnet-owt-7be5be79.pth", "https://download.pytorch.org/models/alexnet-owt-7be5be79.pth",
               "7be5be79", "torchvision AlexNet (ImageNet), LPIPS/tLP backbone"),
    WeightFile("vgg16", "vgg16-397923af.pth", "https://download.pytorch.org/models/vgg16-397923af.pth",
               "397923af", "torchvision VGG16 (ImageNet), LPIPS-VGG/DISTS backbone"),
    WeightFile("lpips_alex", "lpips_v0.1_alex.pth", f"{_GH}/richzhang/PerceptualSimilarity/master/lpips/weights/v0.1/"
               "alex.pth", "df73285e35b22355a2df87cdb6b70b343713b667eddbda73e1977e0c860835c0",
               "LPIPS v0.1 linear heads (AlexNet)"),
    WeightFile("lpips_vgg", "lpips_v0.1_vgg.pth", f"{_GH}/richzhang/PerceptualSimilarity/master/lpips/weights/v0.1/"
               "vgg.pth", "a78928a0af1e5f0fcb1f3b9e8f8c3a2a5a3de244d830ad5c1feddc79b8432868",
               "LPIPS v0.1 linear heads (VGG16)"),
    WeightFile("dists", "dists_alpha_beta.pt", f"{_GH}/dingkeyan93/DISTS/master/DISTS_pytorch/weights.pt",
               "f5e65c96230b7f6ca995691647d482237e4cab8a50c5c4a5784f219ef0748218", "DISTS alpha/beta"),
)}


def needed(specs: Iterable[MetricSpec]) -> list[WeightFile]:
    """The weight files ``specs`` load, each once, in registry order."""
    keys = dict.fromkeys(k for s in specs for k in s.weights)
    return [WEIGHTS[k] for k in keys]


def weight_path(key: str, weights_dir: str | os.PathLike | None = None) -> str:
    """Where file ``key`` lives: ``<weights_dir or model_zoo/metrics>/<filename>``."""
    return os.path.join(os.fspath(weights_dir or DEFAULT_WEIGHTS_DIR), WEIGHTS[key].filename)


def _missing_line(w: WeightFile, path: str, why: str = "") -> str:
    return (f"metric weights {path} are missing{f' and could not be downloaded ({why})' if why else ''}: download "
            f"{w.url} to that path (python scripts/download_metric_weights.py), or point {FLAG} at a folder holding "
            f"{w.filename}")


def ensure_weights(specs: Sequence[MetricSpec], weights_dir: str | os.PathLike | None = None) -> dict[str, str]:
    """Make the weight files of ``specs`` present: rank 0 downloads what is missing (SHA-256-checked, atomic); every
    rank gets the same answer (call it on all ranks, outside ``master_only``).

    Returns:
        ``{key: path}`` of every file ``specs`` need.

    Raises:
        MetricError: a file is missing and could not be fetched (the same line on every rank).
    """
    paths = {}
    for w in needed(specs):
        path = weight_path(w.key, weights_dir)
        error = ensure_file_on_rank0(path, w.url, w.sha256)
        if error is not None:
            # keep the reason only (utils_download's own advice is replaced by ours)
            reason = error.splitlines()[0].split(". If this machine")[0].split(f"{path}: ", 1)[-1]
            raise MetricError(_missing_line(w, path, reason))
        paths[w.key] = path
    return paths


def load_weights(key: str, weights_dir: str | os.PathLike | None = None, verify: bool = True) -> dict:
    """The state dict of file ``key`` (on the CPU, ``weights_only``).

    Args:
        verify: check the SHA-256 against :data:`WEIGHTS` (False only for weights of one's own, e.g. the generated
            ones of the tests, whose numbers are then not the published metric).

    Raises:
        MetricError: the file is missing, or its SHA-256 differs from the published one.
    """
    w, path = WEIGHTS[key], weight_path(key, weights_dir)
    if not os.path.isfile(path):
        raise MetricError(_missing_line(w, path))
    if verify:
        digest = sha256_of(path)
        if not digest.startswith(w.sha256):
            raise MetricError(f"metric weights {path} have SHA-256 {digest}, expected {w.sha256} ({w.what} from "
                              f"{w.url}): replace the file or delete it to download it again")
    state = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(state, dict):
        raise MetricError(f"metric weights {path} hold a {type(state).__name__}, expected a state dict ({w.what})")
    return state
