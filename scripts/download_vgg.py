"""Download torchvision's VGG19 weights (ImageNet) used by the perceptual loss of the GAN model, with a SHA-256
check (against the digest prefix in the file name, which is what torchvision and torch.hub check).

Usage:
    python scripts/download_vgg.py --out model_zoo/vgg/vgg19-dcbb9e9d.pth
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from models.loss import VGG19_SHA256_PREFIX, VGG19_URL  # noqa: E402
from utils.utils_download import download_main  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    return download_main(
        argv, __doc__, label="VGG19", url=VGG19_URL, sha256=VGG19_SHA256_PREFIX,
        default_out="model_zoo/vgg/vgg19-dcbb9e9d.pth",
        out_help="destination file (kept as is if it already exists); train.F_vgg19_path names it")


if __name__ == "__main__":
    sys.exit(main())
