"""Download torchvision's VGG19 weights (ImageNet) used by the perceptual loss of the GAN model, with a SHA-256
check (against the digest prefix in the file name, which is what torchvision and torch.hub check).

Usage:
    python scripts/download_vgg.py --out model_zoo/vgg/vgg19-dcbb9e9d.pth
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from models.loss import VGG19_SHA256_PREFIX, VGG19_URL  # noqa: E402
from utils.utils_download import ensure_file  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--out', default='model_zoo/vgg/vgg19-dcbb9e9d.pth',
                        help='destination file (kept as is if it already exists); train.F_vgg19_path names it')
    parser.add_argument('--url', default=VGG19_URL, help='source address (http(s):// or file://)')
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format='%(message)s')
    try:
        path = ensure_file(args.out, args.url, VGG19_SHA256_PREFIX)
    except RuntimeError as err:
        logging.error('%s', err)
        return 1
    logging.info('VGG19 weights ready at %s', path)
    return 0


if __name__ == '__main__':
    sys.exit(main())
