"""Exactness of the GAN model on the tiny VRT with real processes at 2 intra-op threads, trained on video files with
on-the-fly real-world degradations (VideoFileTrainDataset, realbasicvsr: codec compression included): the same
command twice, a run stopped by SIGTERM and resumed, and 2 processes (one of them SIGKILLed and restarted by
torchrun) against 1 process accumulating 2 micro-batches all end with the same G, EMA, D (spectral-norm vectors
included), both optimizer states and logged numbers, bit for bit.

The run crosses every phase: D alone at step 1 (``D_init_iters``), then G and D, ``fix_iter`` unfreezing G's
SpyNet and deformable parts at step 4, perceptual loss on generated VGG19 weights, vanilla GAN loss. Stochastic
depth is off: its per-rank random streams follow the number of processes by design (tests/test_elastic.py).
"""

from __future__ import annotations

import copy
import os
import re

import pytest
import torch

from tests.support.helpers import (
    VRT_TINY_OPT,
    assert_ok,
    assert_same_run,
    base_env,
    models_dir,
    single,
    torchrun,
    write_opt,
)
from utils.utils_checkpoint import complete_steps

GAN_OPT = copy.deepcopy(VRT_TINY_OPT)
GAN_OPT["model"] = "gan"
GAN_OPT["netG"].update(drop_path_rate=0.0, nonblind_denoising=False)
GAN_OPT["netD"] = {"net_type": "discriminator_unet", "base_nc": 8}
# real-world data end to end: random clips of small H.264 videos (B-frames; written by the first run), degraded on
# the fly by the realbasicvsr preset (blur, resize, noise, JPEG, video-codec compression in bitrate mode, twice);
# 4 clips per video, so the 6 steps of 2 clips cross an epoch
GAN_OPT["datasets"]["train"] = {
    "name": "train_dataset", "dataset_type": "VideoFileTrainDataset", "dataroot_gt": "set by write_opt",
    "synthesize_if_missing": {"num_videos": 2, "num_frames": 12, "size": [48, 48], "seed": 1},
    "num_frame": 2, "gt_size": 40, "clips_per_video": 4, "interval_list": [1, 2], "random_reverse": True,
    "degradations": "realbasicvsr", "use_hflip": True, "use_rot": True, "dataloader_shuffle": True,
    "dataloader_num_workers": 0, "dataloader_batch_size": 2}
GAN_OPT["train"].update(grad_accum_steps=2, D_init_iters=1, D_optimizer_reuse=True, D_lossfn_weight=0.1,
                        F_feature_layer=[2, 7], F_weights=[0.1, 1.0], D_optimizer_lr=2e-3)
GAN_FIELDS_RE = re.compile(r"iter:\s+([\d,]+), lr:\S+> (G_loss: .*?) sec_iter")


def _vgg_weights(path) -> str:
    """Generated torchvision-style VGG19 weights up to conv2_2 (what F_feature_layer [2, 7] reads)."""
    from torchvision.models.vgg import cfgs, make_layers

    gen = torch.Generator().manual_seed(3)
    features = make_layers(cfgs["E"])[:8]
    state = {f"features.{k}": 0.1 * torch.randn(v.shape, generator=gen) for k, v in features.state_dict().items()}
    torch.save(state, path)
    return str(path)


def _run(tmp_path, opt, task, *sets, nproc=1, extra=None, **env):
    args = ["--opt", opt, "--set", f"task={task}", f"path.root={tmp_path / 'experiments'}", *sets]
    # sleeping rather than spinning OpenMP waits (the launcher's choice for oversubscribed CPUs): the numbers are the
    # same, and a 2-core machine shared with other jobs stays usable
    environment = base_env(threads=2, OMP_WAIT_POLICY="PASSIVE", **env)
    if nproc == 1:
        return single(args, environment, str(tmp_path))
    return torchrun(nproc, args, environment, str(tmp_path), extra=extra)


def _gan_fields(tmp_path, task) -> dict[int, str]:
    """The logged GAN numbers of each step (G_loss, F_loss, D_loss, D_real, D_fake, l_d_real, l_d_fake as text)."""
    with open(tmp_path / "experiments" / task / "train.log") as f:
        return {int(m.group(1).replace(",", "")): m.group(2) for m in GAN_FIELDS_RE.finditer(f.read())}


def assert_same_gan_run(tmp_path, task_a, task_b, step):
    """G, EMA, optimizerG and G_loss (the pixel model's comparison), then D and optimizerD tensors and every logged
    GAN field, bit for bit."""
    assert_same_run(tmp_path, task_a, task_b, step)
    for name in ("D", "optimizerD"):
        a, b = (torch.load(os.path.join(models_dir(tmp_path, t), f"{step}_{name}.pth"), weights_only=True)
                for t in (task_a, task_b))
        flat = lambda s: s["params"] if name == "D" else {  # noqa: E731
            f"{i}.{k}": v for i, st in s["state"].items() for k, v in st.items() if isinstance(v, torch.Tensor)}
        fa, fb = flat(a), flat(b)
        assert fa.keys() == fb.keys() and fa, name
        diff = [k for k in fa if not torch.equal(fa[k], fb[k])]
        assert not diff, f"{name} differs in {len(diff)} tensors, e.g. {diff[:3]}"
    fields_a, fields_b = _gan_fields(tmp_path, task_a), _gan_fields(tmp_path, task_b)
    assert sorted(fields_a) == list(range(1, step + 1)) and fields_a == fields_b


@pytest.fixture(scope="module")
def gan_reference(tmp_path_factory):
    """An uninterrupted 6-step GAN run: 1 process, 2 threads, 2 accumulated micro-batches of 1 clip."""
    tmp_path = tmp_path_factory.mktemp("gan")
    opt = write_opt(tmp_path, base=GAN_OPT, train={"F_vgg19_path": _vgg_weights(tmp_path / "vgg19.pth")},
                    datasets={"train": {"dataroot_gt": str(tmp_path / "videos"),
                                        "synthesize_if_missing": {"root": str(tmp_path / "videos")}}})
    proc = _run(tmp_path, opt, "ref")
    assert_ok(proc)
    log = open(tmp_path / "experiments" / "ref" / "train.log").read()
    assert "2 intra-op thread(s)" in log and "deterministic on" in log
    assert "VideoFileTrainDataset: 2 videos (24 frames), 8 items per epoch, LQ from degradations" in log
    assert sorted(os.listdir(tmp_path / "videos")) == ["synthetic_000.mp4", "synthetic_001.mp4"]
    assert "x 2 accumulation step(s)" in log
    fields = _gan_fields(tmp_path, "ref")
    assert "D_loss" not in fields[1] and "D_real" in fields[1]  # step 1: D alone
    assert all(k in fields[2] for k in ("F_loss", "D_loss", "D_real", "D_fake", "l_d_real", "l_d_fake"))
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(tmp_path / "experiments" / "ref" / "tensorboard"))
    events.Reload()
    scalars = set(events.Tags()["scalars"])
    assert {f"train/{k}" for k in ("G_loss", "F_loss", "D_loss", "D_real", "D_fake", "l_d_real", "l_d_fake")} <= scalars
    assert [e.step for e in events.Scalars("train/D_loss")] == [2, 3, 4, 5, 6]
    return tmp_path, opt


def _with_reference(ref_path, tmp_path):
    """Put the reference experiment beside the test's (the comparison helpers read both from one folder)."""
    import shutil

    shutil.copytree(ref_path / "experiments" / "ref", tmp_path / "experiments" / "ref")


def test_the_same_gan_command_twice_is_bit_identical(gan_reference):
    ref_path, opt = gan_reference
    assert_ok(_run(ref_path, opt, "again"))
    assert_same_gan_run(ref_path, "ref", "again", 6)


def test_a_gan_run_stopped_by_sigterm_resumes_bit_identical(gan_reference, tmp_path):
    """SIGTERM during step 3: the step finishes, is checkpointed (G, E, D, both optimizers, then the state file) and
    the process exits 0; the re-run resumes from step 3, starts at fix_iter and equals the uninterrupted run. (A
    SIGKILL mid-run and its restart are covered by the 2-process test below.)"""
    ref_path, opt = gan_reference
    stopped = _run(tmp_path, opt, "term", TEST_SIGNAL_AT_STEP="3", TEST_SIGNAL="SIGTERM")
    assert_ok(stopped)
    assert "Stopped by SIGTERM at step 3: checkpoint saved" in stopped.stdout
    assert complete_steps(models_dir(tmp_path, "term")) == [2, 3]
    assert sorted(n for n in os.listdir(models_dir(tmp_path, "term")) if n.startswith("3_")) == [
        "3_D.pth", "3_E.pth", "3_G.pth", "3_optimizerD.pth", "3_optimizerG.pth", "3_state.pth"]
    again = _run(tmp_path, opt, "term")
    assert_ok(again)
    assert "Resuming from step 3" in again.stdout and "not bit-exact" not in again.stdout + again.stderr
    # its first step is fix_iter (4): SpyNet and the deformable parts train from the resumed run's first step
    _with_reference(ref_path, tmp_path)
    assert_same_gan_run(tmp_path, "ref", "term", 6)


def test_two_gan_processes_with_an_elastic_restart_equal_one_with_accumulation(gan_reference, tmp_path):
    """2 processes of 1 clip each (rank 1 SIGKILLed at step 3, both restarted by torchrun from step 2) against 1
    process accumulating 2 micro-batches: DDP averages ``(g0 + g1) / 2``, accumulation sums ``g0 / 2 + g1 / 2``,
    the same bits for G and D (each micro-batch takes one D backward)."""
    ref_path, opt = gan_reference
    proc = _run(tmp_path, opt, "ddp", "train.grad_accum_steps=1", nproc=2, extra=["--max-restarts=1"],
                TEST_KILL_AT_STEP="3", TEST_KILL_RANK="1")
    assert_ok(proc)
    log = open(tmp_path / "experiments" / "ddp" / "train.log").read()
    assert "Global batch 2 = 1 per process x 2 process(es) x 1 accumulation step(s)" in log
    assert "Resuming from step 2" in log
    _with_reference(ref_path, tmp_path)
    assert_same_gan_run(tmp_path, "ref", "ddp", 6)
