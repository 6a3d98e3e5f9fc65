"""Download the official SpyNet weights (Sintel final) used by VRT/RVRT, with a SHA-256 check.

Usage:
    python scripts/download_spynet.py --out model_zoo/vrt/spynet_sintel_final-3d2a1287.pth
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from models.network_spynet import SPYNET_SHA256_PREFIX, SPYNET_URL  # noqa: E402
from utils.utils_download import ensure_file  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--out', default='model_zoo/vrt/spynet_sintel_final-3d2a1287.pth',
                        help='destination file (kept as is if it already exists)')
    parser.add_argument('--url', default=SPYNET_URL, help='source address (http(s):// or file://)')
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format='%(message)s')
    try:
        path = ensure_file(args.out, args.url, SPYNET_SHA256_PREFIX)
    except RuntimeError as err:
        logging.error('%s', err)
        return 1
    logging.info('SpyNet weights ready at %s', path)
    return 0


if __name__ == '__main__':
    sys.exit(main())
