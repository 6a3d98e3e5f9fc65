"""Under torchrun: train each option file of a job list (``main_train_vrt.main``), then evaluate it with
``main_test_vrt.py --opt`` on the job's input, all in one job of several processes.

Usage: ``networks_entry.py JOBS_JSON``, a list of ``{"opt", "lq", "gt", "args"}`` (``args``: extra flags of
``main_test_vrt.py``); results go to ``results/<task>/``.
"""

from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import main_train_vrt  # noqa: E402
from engine import evaluate  # noqa: E402


def main(argv: list[str]) -> int:
    with open(argv[0]) as f:
        jobs = json.load(f)
    for job in jobs:
        with open(job["opt"]) as f:
            task = json.load(f)["task"]
        if main_train_vrt.main(["--opt", job["opt"]]) != 0:
            return 1
        code = evaluate.main(["--opt", job["opt"], "--folder_lq", job["lq"], "--folder_gt", job["gt"], *job["args"],
                              "--device", "cpu", "--num_workers", "0", "--save_dir", os.path.join("results", task)])
        if code != 0:
            return code
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
