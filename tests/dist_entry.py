"""Run main_train_vrt.main() and report what the test needs from inside each process.

Writes ``$TEST_REPORT_DIR/rank<R>.json`` with the exit code, the process's CUDA_VISIBLE_DEVICES, and a
float64 checksum plus a fingerprint of the final weights of the training model. The test harness writes these
files, not the framework, so "only rank 0 writes experiment files" can still be checked on ``experiments/``.
"""

from __future__ import annotations

import faulthandler
import json
import os
import signal
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import main_train_vrt  # noqa: E402
from data import select_dataset  # noqa: E402
from models.model_plain import ModelPlain  # noqa: E402
from utils import utils_checkpoint, utils_train  # noqa: E402

faulthandler.register(signal.SIGUSR2, all_threads=True)  # the harness dumps the stacks of a hung run
captured = {}
_define = utils_train.define_Model


def _capture(opt, dist_info):
    model = _define(opt, dist_info)
    captured["model"] = model
    return model


utils_train.define_Model = _capture

# ----- fault injection, driven by environment variables (first attempt only under torchrun's restarts) -----
RANK = int(os.environ.get("RANK", 0))
FIRST_ATTEMPT = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"


def _env_int(name):
    value = os.environ.get(name)
    return int(value) if value not in (None, "") else None


_train_micro_batches = ModelPlain.train_micro_batches


def _faulty_step(self, batches, step):
    """TEST_KILL_AT_STEP/TEST_KILL_RANK: SIGKILL before the step; TEST_SIGNAL_AT_STEP/TEST_SIGNAL/TEST_SIGNAL_RANK:
    send a signal to this process during the step."""
    if FIRST_ATTEMPT and step == _env_int("TEST_KILL_AT_STEP") and RANK == (_env_int("TEST_KILL_RANK") or 0):
        os.kill(os.getpid(), signal.SIGKILL)
    if step == _env_int("TEST_SIGNAL_AT_STEP") and RANK == (_env_int("TEST_SIGNAL_RANK") or 0):
        os.kill(os.getpid(), getattr(signal, os.environ.get("TEST_SIGNAL", "SIGTERM")))
    return _train_micro_batches(self, batches, step)


ModelPlain.train_micro_batches = _faulty_step

_atomic_save = utils_checkpoint.atomic_save


def _crashing_save(obj, path):
    """TEST_CRASH_IN_SAVE=<step>: die (SIGKILL) half-way through writing that step's optimizer file."""
    crash = _env_int("TEST_CRASH_IN_SAVE")
    if FIRST_ATTEMPT and crash is not None and os.path.basename(path) == f"{crash}_optimizerG.pth":
        with open(f"{path}.tmp{os.getpid()}", "wb") as f:
            f.write(b"partial")
        os.kill(os.getpid(), signal.SIGKILL)
    return _atomic_save(obj, path)


utils_checkpoint.atomic_save = _crashing_save


class SleepyDataset(select_dataset.DATASETS["syntheticvideotraindataset"]):
    """A training set whose items never arrive (a stalled worker)."""

    def __getitem__(self, index):
        time.sleep(3600)


select_dataset.DATASETS["sleepydataset"] = SleepyDataset

writes: list[str] = []
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC


def _audit(event, args):
    """Record every path this process opens for writing, creates, renames or removes."""
    if event == "open" and isinstance(args[0], (str, bytes, os.PathLike)):
        mode, flags = args[1], args[2]
        writing = isinstance(mode, str) and any(c in mode for c in "wax+")
        if writing or (isinstance(flags, int) and flags & WRITE_FLAGS):
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
