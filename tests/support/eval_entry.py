"""Run main_test_vrt.py's main(), optionally killed part-way (for the resume tests).

``EVAL_KILL_AFTER_FRAMES=K`` SIGKILLs the process right after it has saved its K-th output frame (PNG), i.e. in the
middle of a segment: the frames of that segment are partly on disk, its marker is not, and a video part is being
written. ``EVAL_KILL_RANK`` (default 0) picks the rank that dies under torchrun.
"""

from __future__ import annotations

import logging
import os
import signal
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from engine import evaluate  # noqa: E402

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

if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stdout)
    sys.exit(evaluate.main())
