"""Download the official SpyNet weights (Sintel final) used by VRT/RVRT, with a SHA-256 check.

Usage:
    python scripts/download_spynet.py --out model_zoo/vrt/spynet_sintel_final-3d2a1287.pth
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from models.network_spynet import SPYNET_SHA256_PREFIX, SPYNET_URL  # noqa: E402
from utils.utils_download import download_main  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    return download_main(
        argv, __doc__, label="SpyNet", url=SPYNET_URL, sha256=SPYNET_SHA256_PREFIX,
        default_out="model_zoo/vrt/spynet_sintel_final-3d2a1287.pth")


if __name__ == "__main__":
    sys.exit(main())
