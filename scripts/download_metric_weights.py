"""Download the weight files of the perceptual metrics (LPIPS AlexNet/VGG v0.1, DISTS and their ImageNet backbones)
into the metric weights folder, each SHA-256-checked and moved into place atomically (docs/metrics.md#weights).

Usage:
    python scripts/download_metric_weights.py                       # every file, into model_zoo/metrics
    python scripts/download_metric_weights.py --metrics lpips tlp   # only what these metrics need
    python scripts/download_metric_weights.py --dir /shared/metric_weights

Copy the folder to an offline machine and point ``path.metric_weights`` (option) or ``main_test_vrt.py
--metric_weights`` at it.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from utils.metrics import METRICS, MetricError, resolve  # noqa: E402
from utils.metrics.weights import DEFAULT_WEIGHTS_DIR, ensure_weights  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dir", default=DEFAULT_WEIGHTS_DIR, help="the metric weights folder")
    parser.add_argument("--metrics", nargs="+", default=list(METRICS), help="fetch what these metrics need")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        paths = ensure_weights(resolve(args.metrics, have_gt=True), args.dir)
    except MetricError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    for key, path in paths.items():
        print(f"{key}: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
