"""launch_train.sh: overrides with or without an option file; a one-process launch runs the script directly, so a
user error is one line (no torchrun traceback)."""

from __future__ import annotations

import os
import subprocess

from tests.support.helpers import ROOT, base_env, write_opt

LAUNCH = os.path.join(ROOT, "launch_train.sh")


def _launch(args, tmp_path, **env):
    return subprocess.run(["bash", LAUNCH, *args], env=base_env(NPROC="1", **env), cwd=str(tmp_path),
                          capture_output=True, text=True, timeout=300)


def test_the_demo_takes_overrides_without_an_option_file(tmp_path):
    root = str(tmp_path / "experiments")
    proc = _launch(["--set", "train.total_iter=1", "train.checkpoint_test=0", f"path.root={root}",
                    "datasets.train.dataloader_num_workers=0"], tmp_path)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert os.path.isfile(os.path.join(root, "000_train_vrt_demo", "models", "1_state.pth"))


def test_a_user_error_in_a_one_process_launch_is_one_line(tmp_path):
    opt = write_opt(tmp_path)
    proc = _launch([opt, "--set", "train.total_itr=5"], tmp_path)
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert lines == ["error: unknown option 'train.total_itr'; did you mean 'total_iter'?"], proc.stderr
    assert "torch.distributed" not in proc.stdout + proc.stderr


def test_oversubscribed_cpu_workers_get_a_passive_wait_policy():
    """More OpenMP threads than cores over the CPU workers: the launcher makes waiting threads sleep (spinning ones
    starved the other process: 20-100x slower steps measured); a GPU run, or one that fits, is left alone."""
    from utils.utils_launch import cpu_threads_oversubscribed as over

    script = ["main_train_vrt.py", "--opt", "o.json"]
    assert over(["--standalone", "--nproc_per_node=2", *script], {"OMP_NUM_THREADS": "2"}, 2, False) == (2, 2)
    assert over(["--nproc-per-node", "4", *script], {"OMP_NUM_THREADS": "3"}, 8, False) == (4, 3)
    assert over(["--nproc_per_node=2", *script], {}, 2, False) is None  # torchrun's default: 1 thread each
    assert over(["--nproc_per_node=1", *script], {}, 2, False) is None  # one process takes every core
    assert over(["--nproc_per_node=1", *script], {"OMP_NUM_THREADS": "4"}, 2, False) == (1, 4)
    assert over(["--nproc_per_node=2", *script], {"OMP_NUM_THREADS": "2"}, 4, False) is None
    assert over(["--nproc_per_node=2", *script], {"OMP_NUM_THREADS": "2"}, 2, True) is None  # GPU workers
    assert over(["--nproc_per_node=auto", *script], {"OMP_NUM_THREADS": "2"}, 2, False) is None
