"""Under torchrun: train each option file given (``main_train_vrt.main``), then evaluate it with
``main_test_vrt.py --opt`` on the clip folders given, all in one job of several processes.

Usage: ``networks_entry.py LQ_DIR GT_DIR OPT [OPT ...]``; results go to ``results/<task>/``.
"""

from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import main_train_vrt  # noqa: E402
from engine import evaluate  # noqa: E402


def main(argv: list[str]) -> int:
    lq, gt, *opts = argv
    for opt in opts:
        with open(opt) as f:
            task = json.load(f)["task"]
        if main_train_vrt.main(["--opt", opt]) != 0:
            return 1
        code = evaluate.main(["--opt", opt, "--folder_lq", lq, "--folder_gt", gt, "--device", "cpu",
                              "--num_workers", "0", "--save_dir", os.path.join("results", task)])
        if code != 0:
            return code
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
