"""Run main_train_vrt.main() and report what the test needs from inside each process.

Writes ``$TEST_REPORT_DIR/rank<R>.json`` with the exit code, the process's CUDA_VISIBLE_DEVICES, and a
float64 checksum plus a fingerprint of the final weights of the training model. The test harness writes these
files, not the framework, so "only rank 0 writes experiment files" can still be checked on ``experiments/``.
"""

from __future__ import annotations

import faulthandler
import gc
import json
import os
import signal
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import main_train_vrt  # noqa: E402
from data import select_dataset  # noqa: E402
from engine import train as engine_train  # noqa: E402
from engine.preemption import StopRequest  # noqa: E402
from models.model_gan import ModelGAN  # noqa: E402
from models.model_plain import ModelPlain  # noqa: E402
from tests.support.helpers import held_marker  # noqa: E402
from utils import utils_checkpoint  # noqa: E402

faulthandler.register(signal.SIGUSR2, all_threads=True)  # the harness dumps the stacks of a hung run
captured = {}
_define = engine_train.define_Model


def _capture(opt, dist_info):
    model = _define(opt, dist_info)
    captured["model"] = model
    return model


engine_train.define_Model = _capture

# ----- fault injection, driven by environment variables (first attempt only under torchrun's restarts) -----
RANK = int(os.environ.get("RANK", os.environ.get("SLURM_PROCID", 0)))  # srun tasks get RANK later, in main
FIRST_ATTEMPT = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"


def _env_int(name):
    value = os.environ.get(name)
    return int(value) if value not in (None, "") else None


# the classes whose train_step is a whole step (ModelVRT's calls ModelPlain's) get the hooks below
_train_steps = {ModelPlain: ModelPlain.train_step, ModelGAN: ModelGAN.train_step}


def _faulty_step(self, batches, step):
    """TEST_KILL_AT_STEP/TEST_KILL_RANK: SIGKILL before the step; TEST_SIGNAL_AT_STEP/TEST_SIGNAL/TEST_SIGNAL_RANK:
    send a signal during the step to this process (TEST_SIGNAL_TARGET unset), to its parent (``parent``: the
    torchrun agent) or to the parent's process group (``group``: what Ctrl-C in a terminal does)."""
    if FIRST_ATTEMPT and step == _env_int("TEST_KILL_AT_STEP") and RANK == (_env_int("TEST_KILL_RANK") or 0):
        os.kill(os.getpid(), signal.SIGKILL)
    if step == _env_int("TEST_SIGNAL_AT_STEP") and RANK == (_env_int("TEST_SIGNAL_RANK") or 0):
        sig = getattr(signal, os.environ.get("TEST_SIGNAL", "SIGTERM"))
        target = os.environ.get("TEST_SIGNAL_TARGET", "self")
        if target == "parent":
            os.kill(os.getppid(), sig)
        elif target == "group":
            os.killpg(os.getpgid(os.getppid()), sig)
        else:
            os.kill(os.getpid(), sig)
    return _train_steps[ModelGAN if isinstance(self, ModelGAN) else ModelPlain](self, batches, step)


ModelPlain.train_step = _faulty_step

# ----- what each step trains on, and a gate that holds the steps (elastic tests):
#   TEST_LOG_ITEMS=1 appends one line per step and rank to $TEST_REPORT_DIR/items-rank<R>-<pid>.jsonl:
#     {"step", "rank", "world", "t", "items": [[key, float64 sum of L, float64 sum of H], ...]};
#   TEST_STEP_GATE=<file> holds step s while s > the number in <file> (absent: no hold), until a stop signal arrives;
#     a held rank first writes s to helpers.held_marker(<file>, R) (tests read it with helpers.held_step).
_stop_handle = StopRequest._handle
stop_seen = []


def _recording_handle(self, signum, frame):
    stop_seen.append(signum)
    return _stop_handle(self, signum, frame)


StopRequest._handle = _recording_handle


def _gate_limit(path):
    try:
        with open(path) as f:
            return int(f.read().strip() or 0)
    except (OSError, ValueError):
        return None


def _held(step):
    gate = os.environ.get("TEST_STEP_GATE")
    if not gate:
        return
    marked = False
    while not stop_seen:
        limit = _gate_limit(gate)
        if limit is None or step <= limit:
            return
        if not marked:
            with open(held_marker(gate, RANK), "w") as f:
                f.write(str(step))
            marked = True
        time.sleep(0.05)


def _log_items(batches, step):
    report_dir = os.environ.get("TEST_REPORT_DIR")
    if os.environ.get("TEST_LOG_ITEMS") != "1" or not report_dir:
        return
    items = []
    for data in batches:
        for i, key in enumerate(data["key"]):
            items.append([key, float(data["L"][i].double().sum()), float(data["H"][i].double().sum())])
    line = {"step": step, "rank": RANK, "world": int(os.environ.get("WORLD_SIZE", 1)), "t": time.time(),
            "items": items}
    with open(os.path.join(report_dir, f"items-rank{RANK}-{os.getpid()}.jsonl"), "a") as f:
        f.write(json.dumps(line) + "\n")


_gated_inner = ModelPlain.train_step


def _gated_step(self, batches, step):
    _held(step)
    _log_items(batches, step)
    return _gated_inner(self, batches, step)


ModelPlain.train_step = ModelGAN.train_step = _gated_step

# ----- crashes inside the real checkpoint write: TEST_CRASH_IN_SAVE="<step>:<file>:<point>[,...]" kills this process
# (SIGKILL) while the real utils_checkpoint.atomic_save writes ``{step}_{file}.pth`` (file: G, E, optimizerG, state):
#   before  - on entering atomic_save for that file (all earlier files of the step are complete and renamed);
#   write   - inside torch.save, after part of the file's bytes have reached the temporary file;
#   replace - after the temporary file is written and fsynced, just before os.replace.
CRASHES = {tuple(item.split(":")[:2]): item.split(":")[2]
           for item in os.environ.get("TEST_CRASH_IN_SAVE", "").split(",") if item}


def _crash_point(path):
    stem = os.path.basename(path).split(".pth")[0]
    return CRASHES.get(tuple(stem.split("_", 1))) if "_" in stem else None


_atomic_save = utils_checkpoint.atomic_save
_real_torch_save = torch.save
_real_replace = os.replace


class _KillAfterBytes:
    """A file proxy for torch.save that dies once ``limit`` bytes went through it."""

    def __init__(self, f, limit):
        self.f, self.limit, self.count = f, limit, 0

    def write(self, data):
        n = self.f.write(data)
        self.count += len(data)
        if self.count >= self.limit:
            self.f.flush()
            os.fsync(self.f.fileno())
            os.kill(os.getpid(), signal.SIGKILL)
        return n

    def __getattr__(self, name):
        return getattr(self.f, name)


def _crashing_save(obj, path):
    if _crash_point(path) == "before":
        os.kill(os.getpid(), signal.SIGKILL)
    return _atomic_save(obj, path)


def _torch_save(obj, f, *args, **kwargs):
    name = getattr(f, "name", None)
    if isinstance(name, str) and _crash_point(name.rsplit(".tmp", 1)[0]) == "write":
        f = _KillAfterBytes(f, 64)
    return _real_torch_save(obj, f, *args, **kwargs)


def _replace(src, dst, *args, **kwargs):
    if isinstance(dst, str) and dst.endswith(".pth") and _crash_point(dst) == "replace":
        os.kill(os.getpid(), signal.SIGKILL)
    return _real_replace(src, dst, *args, **kwargs)


if CRASHES:
    utils_checkpoint.atomic_save = _crashing_save
    torch.save = _torch_save
    os.replace = _replace


class SleepyDataset(select_dataset.DATASETS["syntheticvideotraindataset"]):
    """A training set whose items never arrive (a stalled worker)."""

    def __getitem__(self, index):
        time.sleep(3600)


select_dataset.DATASETS["sleepydataset"] = SleepyDataset

# ----- TEST_HIDE_STATE_RANK=<r>: rank r cannot see any ``*_state.pth`` (experiments/ on a disk of another node)
if os.environ.get("TEST_HIDE_STATE_RANK") not in (None, "") and RANK == int(os.environ["TEST_HIDE_STATE_RANK"]):
    _isfile = os.path.isfile
    os.path.isfile = lambda path: False if str(path).endswith("_state.pth") else _isfile(path)

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


def _native_threads() -> list[str]:
    """The names of this process's threads (``gloo_tcp_loop``, ``pt_gloo_runloop``, ... for a live gloo group)."""
    names = []
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                names.append(f.read().strip())
        except OSError:  # the thread ended meanwhile
            pass
    return names


if __name__ == "__main__":
    code = main_train_vrt.main(sys.argv[1:])
    report_dir = os.environ.get("TEST_REPORT_DIR")
    report = {"rc": code, "rank": int(os.environ.get("RANK", 0)),
              "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
              "master_addr": os.environ.get("MASTER_ADDR"), "master_port": os.environ.get("MASTER_PORT"),
              "world_size": int(os.environ.get("WORLD_SIZE", 1)),
              "writes": [os.path.abspath(w if isinstance(w, str) else w.decode()) for w in writes]}
    model = captured.pop("model", None)
    if model is not None:
        params = [p.detach().double() for p in model.net_g.parameters()]
        report["checksum"] = float(sum(p.sum() for p in params))
        report["fingerprint"] = [float(p.flatten()[:4].sum()) for p in params]
        del model, params
    # The captured model's DDP wrapper holds the gloo process group; kept to the end, its threads outlive
    # destroy_dist and are torn down in interpreter shutdown, where they can abort the process ("terminate called
    # without an active exception", SIGABRT: 3 in 15 two-rank exits). Freed here, as after main_train_vrt.main alone;
    # the threads left are reported so a test sees the group really gone.
    gc.collect()
    report["threads_at_exit"] = sorted(_native_threads()) if os.path.isdir("/proc/self/task") else None
    if report_dir:
        with open(os.path.join(report_dir, f"rank{report['rank']}.json"), "w") as f:
            json.dump(report, f)
    sys.exit(code)
