"""Run main_train_vrt.main() and report what the test needs from inside each process.

Writes ``$TEST_REPORT_DIR/rank<R>.json`` with the exit code, the process's CUDA_VISIBLE_DEVICES, and a
float64 checksum plus a fingerprint of the final weights of the training model. The test harness writes these
files, not the framework, so "only rank 0 writes experiment files" can still be checked on ``experiments/``.
"""

from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import main_train_vrt  # noqa: E402
from utils import utils_train  # noqa: E402

captured = {}
_define = utils_train.define_Model


def _capture(opt, dist_info):
    model = _define(opt, dist_info)
    captured["model"] = model
    return model


utils_train.define_Model = _capture

writes: list[str] = []
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC


def _audit(event, args):
    """Record every path this process opens for writing, creates, renames or removes."""
    if event == "open" and isinstance(args[0], (str, bytes, os.PathLike)):
        mode, flags = args[1], args[2]
        if (isinstance(mode, str) and any(c in mode for c in "wax+")) or (isinstance(flags, int) and flags & WRITE_FLAGS):
            writes.append(os.fspath(args[0]))
    elif event in ("os.mkdir", "os.rename", "os.remove", "shutil.rmtree"):
        writes.append(os.fspath(args[0]) if isinstance(args[0], (str, bytes, os.PathLike)) else str(args[0]))


sys.addaudithook(_audit)

if __name__ == "__main__":
    code = main_train_vrt.main(sys.argv[1:])
    report_dir = os.environ.get("TEST_REPORT_DIR")
    if report_dir:
        report = {"rc": code, "rank": int(os.environ.get("RANK", 0)),
                  "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
                  "writes": [os.path.abspath(w if isinstance(w, str) else w.decode()) for w in writes]}
        model = captured.get("model")
        if model is not None:
            params = [p.detach().double() for p in model.net_g.parameters()]
            report["checksum"] = float(sum(p.sum() for p in params))
            report["fingerprint"] = [float(p.flatten()[:4].sum()) for p in params]
        with open(os.path.join(report_dir, f"rank{report['rank']}.json"), "w") as f:
            json.dump(report, f)
    sys.exit(code)
