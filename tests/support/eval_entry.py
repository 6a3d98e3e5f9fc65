"""Run main_test_vrt.py's main(), optionally killed or signalled part-way (for the resume tests).

``EVAL_KILL_AFTER_FRAMES=K`` SIGKILLs the process right after it has saved its K-th output frame (PNG), i.e. in the
middle of a segment: the frames of that segment are partly on disk, its marker is not, and a video part is being
written. ``EVAL_KILL_RANK`` (default 0) picks the rank that dies under torchrun. ``EVAL_SIGNAL_GROUP_AFTER_FRAMES=K``
sends ``EVAL_SIGNAL`` (default SIGTERM) to the whole process group at that point instead, as ``timeout`` or
``scancel`` do. ``EVAL_UNVERIFIED_METRIC_WEIGHTS=1`` loads the tests' generated metric weights
(tests/support/metric_data.py) without the SHA-256 check.
"""

from __future__ import annotations

import logging
import os
import signal
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from engine import evaluate, scoring  # noqa: E402

if os.environ.get("EVAL_UNVERIFIED_METRIC_WEIGHTS"):
    scoring.VERIFY_WEIGHTS = False

KILL_AFTER = int(os.environ.get("EVAL_KILL_AFTER_FRAMES") or 0)
if KILL_AFTER and int(os.environ.get("RANK", 0)) == int(os.environ.get("EVAL_KILL_RANK", 0)):
    _write = evaluate.imwrite_rgb
    _count = [0]

    def _write_then_die(path, img):
        _write(path, img)
        _count[0] += 1
        if _count[0] == KILL_AFTER:
            os.kill(os.getpid(), signal.SIGKILL)

    evaluate.imwrite_rgb = _write_then_die

SIGNAL_AFTER = int(os.environ.get("EVAL_SIGNAL_GROUP_AFTER_FRAMES") or 0)
if SIGNAL_AFTER:  # a stop signal to the whole process group (timeout, scancel, Ctrl-C) in the middle of a segment
    _write_before_signal = evaluate.imwrite_rgb
    _written = [0]

    def _write_then_signal(path, img):
        _write_before_signal(path, img)
        _written[0] += 1
        if _written[0] == SIGNAL_AFTER:
            os.killpg(os.getpgid(0), getattr(signal, os.environ.get("EVAL_SIGNAL", "SIGTERM")))

    evaluate.imwrite_rgb = _write_then_signal

if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stdout)
    sys.exit(evaluate.main())
