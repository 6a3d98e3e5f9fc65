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


def _after_frames(count: int, action) -> None:
    """Run ``action()`` once this process has written ``count`` output frames (in the middle of a segment)."""
    write, written = evaluate.imwrite_rgb, [0]

    def write_then_act(path, img):
        write(path, img)
        written[0] += 1
        if written[0] == count:
            action()

    evaluate.imwrite_rgb = write_then_act


KILL_AFTER = int(os.environ.get("EVAL_KILL_AFTER_FRAMES") or 0)
if KILL_AFTER and int(os.environ.get("RANK", 0)) == int(os.environ.get("EVAL_KILL_RANK", 0)):
    _after_frames(KILL_AFTER, lambda: os.kill(os.getpid(), signal.SIGKILL))

SIGNAL_AFTER = int(os.environ.get("EVAL_SIGNAL_GROUP_AFTER_FRAMES") or 0)
if SIGNAL_AFTER:  # a stop signal to the whole process group (timeout, scancel, Ctrl-C) in the middle of a segment
    _sig = getattr(signal, os.environ.get("EVAL_SIGNAL", "SIGTERM"))
    _after_frames(SIGNAL_AFTER, lambda: os.killpg(os.getpgid(0), _sig))

if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stdout)
    sys.exit(evaluate.main())
