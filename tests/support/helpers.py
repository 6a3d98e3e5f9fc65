"""Shared helpers for the end-to-end tests: tiny option files and real multi-process launches."""

from __future__ import annotations

import copy
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from typing import Any

import torch
from torch import nn

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DIST_ENTRY = os.path.join(ROOT, "tests", "support", "dist_entry.py")
TORCHRUN_ENTRY = os.path.join(ROOT, "tests", "support", "torchrun_entry.py")


class BNNet(nn.Module):
    """A tiny network with running statistics (BatchNorm) and an fp64 buffer next to the fp32 ones."""

    def __init__(self, upscale: int = 1) -> None:
        super().__init__()
        self.conv_first = nn.Conv3d(3, 4, 1)
        self.bn = nn.BatchNorm3d(4)
        self.conv_last = nn.Conv3d(4, 3, 1)
        self.register_buffer('table', torch.arange(6, dtype=torch.float64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv_last(self.bn(self.conv_first(x.transpose(1, 2)))).transpose(1, 2)


TINY_OPT: dict[str, Any] = {
    "task": "tiny",
    "model": "vrt",
    "gpu_ids": [0, 1, 2, 3, 4, 5, 6, 7],
    "dist": True,
    "scale": 4,
    "n_channels": 3,
    "path": {"root": "experiments", "pretrained_netG": None},
    "datasets": {
        "train": {"name": "train_dataset", "dataset_type": "SyntheticVideoTrainDataset", "task": "sr",
                  "num_frame": 2, "gt_size": 32, "num_clips": 64, "seed": 0, "use_hflip": True, "use_rot": True,
                  "dataloader_shuffle": True, "dataloader_num_workers": 0, "dataloader_batch_size": 2},
        "test": {"name": "test_dataset", "dataset_type": "SyntheticVideoTestDataset", "task": "sr", "num_clips": 3,
                 "num_frame": 2, "lq_size": [16, 16], "seed": 7},
    },
    "netG": {"net_type": "videoconvbaseline", "upscale": 4, "num_feat": 8, "num_block": 1},
    "train": {"G_lossfn_type": "charbonnier", "G_optimizer_lr": 1e-3, "G_optimizer_betas": [0.9, 0.99],
              "G_optimizer_reuse": True, "total_iter": 3, "G_scheduler_periods": 100, "G_scheduler_eta_min": 1e-7,
              "manual_seed": 0, "checkpoint_test": 0, "checkpoint_save": 1000, "checkpoint_print": 1},
    "val": {"save_img": False},
}


# A network whose training forward draws from the global torch RNG (stochastic depth, as VRT's): resume tests use it
# so that a resumed run that consumed the RNG stream differently would not end bit-identical.
RNG_NET: dict[str, Any] = {"net_type": "videoconvbaseline", "upscale": 4, "num_feat": 8, "num_block": 2,
                           "drop_path_rate": 0.5}


# Tiny real networks for the promises (exactness, recovery, distributed equality): a VRT denoiser with parallel
# warping, stochastic depth, EMA, accumulation and a fix_iter phase change at step 4; 7 training clips, so epochs
# (3 steps of 2 clips) end unevenly.
VRT_TINY_OPT: dict[str, Any] = {
    "task": "vrt", "model": "vrt", "scale": 1, "n_channels": 3,
    "path": {"root": "experiments", "pretrained_netG": None},
    "datasets": {
        "train": {"name": "train_dataset", "dataset_type": "SyntheticVideoTrainDataset", "task": "denoise",
                  "num_frame": 2, "gt_size": 40, "num_clips": 7, "seed": 0, "sigma_min": 0, "sigma_max": 50,
                  "use_hflip": True, "use_rot": True, "dataloader_shuffle": True, "dataloader_num_workers": 1,
                  "dataloader_batch_size": 2},
    },
    "netG": {"net_type": "vrt", "upscale": 1, "img_size": [2, 40, 40], "window_size": [2, 4, 4], "depths": [1] * 9,
             "indep_reconsts": [], "embed_dims": [12] * 9, "num_heads": [2] * 9, "pa_frames": 2,
             "deformable_groups": 2, "spynet_path": None, "nonblind_denoising": True, "drop_path_rate": 0.2},
    "train": {"G_lossfn_type": "charbonnier", "G_optimizer_lr": 1e-3, "G_optimizer_betas": [0.9, 0.99],
              "G_optimizer_reuse": True, "E_decay": 0.9, "grad_accum_steps": 2, "fix_iter": 4,
              "fix_keys": ["spynet", "deform"], "fix_lr_mul": 0.25, "total_iter": 6, "G_scheduler_periods": 100,
              "G_scheduler_eta_min": 1e-7, "manual_seed": 0, "checkpoint_test": 0, "checkpoint_save": 2,
              "checkpoint_print": 1},
}
# A tiny x4 RVRT (guided deformable attention, SpyNet) trained under bf16 autocast.
RVRT_TINY_OPT: dict[str, Any] = copy.deepcopy(VRT_TINY_OPT) | {
    "task": "rvrt", "model": "rvrt", "scale": 4,
    "netG": {"net_type": "rvrt", "upscale": 4, "clip_size": 2, "window_size": [2, 4, 4], "num_blocks": [1, 1, 1],
             "depths": [1, 1, 1], "embed_dims": [12, 12, 12], "num_heads": [2, 2, 2],
             "inputconv_groups": [1, 1, 1, 1, 1, 1], "deformable_groups": 2, "attention_heads": 2,
             "attention_window": [3, 3], "spynet_path": None},
}
RVRT_TINY_OPT["datasets"] = {"train": {**VRT_TINY_OPT["datasets"]["train"], "task": "sr", "gt_size": 144}}
RVRT_TINY_OPT["train"] = {**VRT_TINY_OPT["train"], "amp": "bf16"}


def held_marker(gate, rank: int = 0) -> str:
    """The file a rank held by ``TEST_STEP_GATE=<gate>`` (tests/support/dist_entry.py) writes its held step to."""
    return f"{gate}.held-rank{rank}"


def held_step(gate, rank: int = 0) -> int | None:
    """The step rank ``rank`` is held at by the gate file ``gate`` (None before it is held at any): once it reads s,
    the rank has passed step s-1's stop agreement, so a stop signal sent now stops the run at step s."""
    try:
        with open(held_marker(gate, rank)) as f:
            return int(f.read())
    except (OSError, ValueError):
        return None


def write_opt(tmp_path, name: str = "opt.json", base: dict[str, Any] | None = None, **sections: Any) -> str:
    """Write an option file from ``base`` (default: the toy-net :data:`TINY_OPT`); keyword arguments replace or
    update top-level sections (dicts are merged, except ``netG``, which is replaced)."""
    opt = copy.deepcopy(TINY_OPT if base is None else base)
    for key, value in sections.items():
        if isinstance(value, dict) and isinstance(opt.get(key), dict) and key != "netG":
            _merge(opt[key], value)
        else:
            opt[key] = value
    opt["path"]["root"] = str(tmp_path / "experiments")
    path = tmp_path / name
    path.write_text(json.dumps(opt, indent=1))
    return str(path)


def _merge(dst: dict, src: dict) -> None:
    for key, value in src.items():
        if isinstance(value, dict) and isinstance(dst.get(key), dict):
            _merge(dst[key], value)
        else:
            dst[key] = value


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def base_env(report_dir: str | None = None, threads: int | None = 1, **extra: str) -> dict[str, str]:
    """The environment of a launched test process: no inherited launcher variables, the CPU, ``threads`` intra-op
    threads (``None``: torch's default)."""
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR",
                                                           "MASTER_PORT", "TORCHELASTIC_RUN_ID", "OMP_NUM_THREADS")}
    # the repository first; the caller's own entries after it (packages installed with --target, as on a GPU host)
    path = os.pathsep.join([ROOT, *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))])
    env.update(PYTHONPATH=path, VRT_DEVICE="cpu", PYTHONUNBUFFERED="1")
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(threads)
    if report_dir:
        env["TEST_REPORT_DIR"] = report_dir
    env.update(extra)
    return env


def _descendants(pid: int) -> list[int]:
    """Every live descendant of ``pid`` (torchrun starts its workers in new sessions, so a process group kill
    would miss them)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def run(cmd: list[str], env: dict[str, str], cwd: str, timeout: float = 240,
        new_session: bool = False) -> subprocess.CompletedProcess:
    """Run ``cmd`` to completion. Past ``timeout``, every process under it first dumps its Python stacks (SIGUSR2,
    registered by ``dist_entry.py``) and is then killed, so a hang fails with the stacks instead of leaving orphaned
    workers behind; the result then has return code -9 and "TIMEOUT" on its stderr. ``new_session`` starts ``cmd`` in
    a process group of its own (a terminal's foreground job), so a test may signal that group."""
    proc = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=new_session)
    try:
        out, err = proc.communicate(timeout=timeout)
        return subprocess.CompletedProcess(cmd, proc.returncode, out, err)
    except subprocess.TimeoutExpired:
        tree = _descendants(proc.pid)
        for pid in tree:
            _signal(pid, signal.SIGUSR2)
        time.sleep(3)
        for pid in [proc.pid, *_descendants(proc.pid), *tree]:
            _signal(pid, signal.SIGKILL)
        out, err = proc.communicate()
        return subprocess.CompletedProcess(cmd, -9, out, f"{err}\nTIMEOUT after {timeout:.0f} s: {' '.join(cmd)}")


def kill_tree(proc: subprocess.Popen) -> None:
    """SIGKILL ``proc`` and every process under it."""
    for pid in [proc.pid, *_descendants(proc.pid)]:
        _signal(pid, signal.SIGKILL)


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def torchrun(nproc: int, args: list[str], env: dict[str, str], cwd: str, extra: list[str] | None = None,
             timeout: float = 240) -> subprocess.CompletedProcess:
    cmd = [sys.executable, TORCHRUN_ENTRY, "--standalone", f"--nproc_per_node={nproc}",
           *(extra or []), DIST_ENTRY, *args]
    proc = run(cmd, env, cwd, timeout)
    if proc.returncode != 0 and "timed out connecting" in proc.stderr and "Resuming" not in proc.stdout:
        proc = run(cmd, env, cwd, timeout)  # a gloo rendezvous flake on a loaded machine: launch once more
    return proc


def single(args: list[str], env: dict[str, str], cwd: str, timeout: float = 240) -> subprocess.CompletedProcess:
    return run([sys.executable, DIST_ENTRY, *args], env, cwd, timeout)


def load_params(path: str) -> dict[str, torch.Tensor]:
    return torch.load(path, map_location="cpu", weights_only=True)["params"]


def max_abs_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k].double() - b[k].double()).abs().max()) for k in a)


def reports(report_dir: str) -> list[dict[str, Any]]:
    out = []
    for name in sorted(os.listdir(report_dir)):
        if name.startswith("rank") and name.endswith(".json"):
            with open(os.path.join(report_dir, name)) as f:
                out.append(json.load(f))
    return out


def assert_ok(proc: subprocess.CompletedProcess) -> None:
    tail = f"STDOUT:\n{proc.stdout[-4000:]}\nSTDERR:\n{proc.stderr[-4000:]}"
    assert proc.returncode == 0, f"exit {proc.returncode}\n{tail}"


# ---------------------------------------------------------------------------------------- comparing two runs
LOSS_RE = re.compile(r"iter:\s+([\d,]+), lr:\S+> G_loss: (\S+)")


def models_dir(tmp_path, task):
    return os.path.join(tmp_path, "experiments", task, "models")


def logged_losses(tmp_path, task) -> dict[int, str]:
    """Logged loss per step (the text, so formatting is compared too), over all runs of the task."""
    with open(os.path.join(tmp_path, "experiments", task, "train.log")) as f:
        return {int(m.group(1).replace(",", "")): m.group(2) for m in LOSS_RE.finditer(f.read())}


def run_state(tmp_path, task, step) -> dict[str, dict[str, torch.Tensor]]:
    """Weights, EMA and flattened optimizer state of a checkpoint."""
    models = models_dir(tmp_path, task)
    load = lambda name: torch.load(os.path.join(models, f"{step}_{name}.pth"), weights_only=True)  # noqa: E731
    out = {"G": load("G")["params"]}
    if os.path.isfile(os.path.join(models, f"{step}_E.pth")):
        out["E"] = load("E")["params_ema"]
    opt = load("optimizerG")
    out["optimizer"] = {f"{i}.{k}": v for i, s in opt["state"].items() for k, v in s.items()
                        if isinstance(v, torch.Tensor)}
    return out


def assert_same_run(tmp_path, task_a, task_b, step):
    """Two runs' checkpoints at ``step`` (weights, EMA, optimizer state) and logged losses are bit-identical."""
    a, b = run_state(tmp_path, task_a, step), run_state(tmp_path, task_b, step)
    assert a.keys() == b.keys()
    for part in a:
        assert a[part].keys() == b[part].keys(), part
        diff = [k for k in a[part] if not torch.equal(a[part][k], b[part][k])]
        worst = max((float((a[part][k].double() - b[part][k].double()).abs().max()) for k in diff), default=0.0)
        assert not diff, f"{part} differs in {len(diff)} tensors (max |diff| {worst:.3g}), e.g. {diff[:3]}"
    assert logged_losses(tmp_path, task_a) == logged_losses(tmp_path, task_b)
