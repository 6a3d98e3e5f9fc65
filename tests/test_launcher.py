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
