"""Trainable units (models/trainable_unit.py): checkpoints written before the units existed resume bit-exactly, a
network that trains beside G is one declaration, and the units' one code path for optimizers, LR, files and
resume holds for every unit."""

from __future__ import annotations

import json
import logging
import os
import re
import shutil

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from engine.options import parse_options
from engine.resume import epoch_items, inexact_resume_reasons
from models.model_gan import ModelGAN
from models.model_plain import ModelPlain
from models.trainable_unit import TrainableUnit
from tests.fixtures.resume_before_units.make_fixture import kernel_signature
from tests.support.helpers import ROOT, assert_ok, base_env, single
from utils.utils_checkpoint import CheckpointError
from utils.utils_dist import DistInfo

FIXTURE = os.path.join(ROOT, "tests", "fixtures", "resume_before_units")
FIELDS_RE = re.compile(r"iter:\s+([\d,]+), lr:(\S+)> (G_loss: .*?) sec_iter")  # what make_fixture.py kept


# On a CPU whose kernels differ from the recording machine's (another dispatch level, vendor, model, instruction set
# or cache sizes), float sums run in another order, and Adam's first steps after the fix_iter phase change (a fresh
# moment for the unfrozen layer) move each weight by about +-lr whatever the size of its gradient, so a gradient near
# zero that rounds to the other sign moves its weight by ~2 lr: the runs then part by far more than rounding. Each
# file is compared there by its difference's L2 norm relative to the recorded file's (weights, EMA, optimizer
# moments). On an AMD EPYC with AVX-512 (Zen 4), rounding alone gave plain G 2.7e-4, E 5.8e-5, optimizerG 3.5e-3; GAN
# G 2.0e-4, E 2.5e-5, D 8.3e-4, optimizerG 1.5e-3, optimizerD 1.25e-2; the resumes these tests exist to catch gave, on
# that machine: the EMA copy restarted from G, plain E 1.2e-2, GAN E 8.3e-3; G's optimizer restarted, plain G 1.45e-2,
# optimizerG 0.21, GAN G 9.4e-3, optimizerG 0.35; D's optimizer restarted, D 3.7e-2, optimizerD 0.54. Each bound
# sits between the two. Step counts, learning rates, the GradScaler, the RNG streams and the sampler position are
# compared exactly everywhere.
OTHER_KERNELS_REL_L2 = {"plain": {"G": 2e-3, "E": 8e-4, "optimizerG": 2.5e-2},
                        "gan": {"G": 1.5e-3, "E": 5e-4, "D": 5e-3, "optimizerG": 2e-2, "optimizerD": 8e-2}}


def _relative_l2(got: dict[str, object], want: dict[str, object]) -> float:
    """||got - want|| / ||want|| over the floating-point tensors of a file (step counters excepted)."""
    keys = [k for k, b in want.items() if isinstance(b, torch.Tensor) and b.is_floating_point()
            and not k.endswith(".step")]
    diff = sum(float((got[k].double() - want[k].double()).square().sum()) for k in keys)
    norm = sum(float(want[k].double().square().sum()) for k in keys)
    return (diff / norm) ** 0.5


def _same_kernels() -> bool:
    """This machine runs the CPU kernels of the one that recorded the fixture."""
    with open(os.path.join(FIXTURE, "meta.json")) as f:
        return json.load(f)["kernels"] == kernel_signature()


def _flat(obj, prefix: str = "") -> dict[str, object]:
    """Every tensor and number of a loaded checkpoint file, by a dotted path."""
    if isinstance(obj, dict):
        items = obj.items()
    elif isinstance(obj, (list, tuple)):
        items = enumerate(obj)
    else:
        return {prefix[:-1]: obj}
    out = {}
    for key, value in items:
        out.update(_flat(value, f"{prefix}{key}."))
    return out


def test_a_checkpoint_older_than_items_in_epoch_resumes_at_every_ranks_position():
    """Before ``items_in_epoch``, a state file counted one rank's batches (``batches_in_epoch``), with one RNG
    state per rank: all ranks together consumed batches x per-process batch x ranks items."""
    assert epoch_items({"batches_in_epoch": 3, "rng": [{}, {}]}, per_process=2) == 12
    assert epoch_items({"batches_in_epoch": 3, "rng": [{}]}, per_process=2) == 6
    assert epoch_items({"items_in_epoch": 7, "batches_in_epoch": 3, "rng": [{}, {}]}, per_process=2) == 7
    assert epoch_items({}, per_process=2) == 0


@pytest.mark.parametrize("name", ["plain", "gan"])
def test_checkpoints_written_before_the_units_resume_bit_exactly(tmp_path, name):
    """The checkpoint an older version wrote mid-run (``resume/``: G, E, optimizerG, for the GAN D and optimizerD,
    and the state file with D's scheduler entry) is resumed by this version in a real process at 2 threads; its
    last checkpoint and every logged number equal those of the older version's uninterrupted run, bit for bit: the
    weights, EMA, D with its spectral-norm vectors, both optimizers' moments and learning rates, the fp16 GradScaler,
    the RNG streams and the sampler position (on a CPU with other kernels: see OTHER_KERNELS_REL_L2)."""
    src = os.path.join(FIXTURE, name)
    with open(os.path.join(src, "expected.json")) as f:
        expected = json.load(f)
    with open(os.path.join(src, "opt.json")) as f:
        task = json.load(f)["task"]
    start, total = expected["resume_step"], expected["total_iter"]
    models = tmp_path / "experiments" / task / "models"
    shutil.copytree(os.path.join(src, "resume"), models)
    shutil.copy(os.path.join(FIXTURE, "vgg19.pth"), tmp_path / "vgg19.pth")  # the GAN's relative F_vgg19_path
    proc = single(["--opt", os.path.join(src, "opt.json")], base_env(threads=2), str(tmp_path))
    assert_ok(proc)
    assert f"Resuming from step {start}" in proc.stdout and "not bit-exact" not in proc.stdout + proc.stderr

    straight = os.path.join(src, "straight")
    assert sorted(f for f in os.listdir(models) if f.startswith(f"{total}_")) == sorted(os.listdir(straight))
    exact = _same_kernels()
    for fname in sorted(os.listdir(straight)):
        want, got = (torch.load(path, weights_only=True) for path in (os.path.join(straight, fname), models / fname))
        if fname.endswith("_state.pth"):  # D's scheduler entry was dead state (D's LR is the closed form of the step)
            want.pop("scheduler_D", None)
            # the settings record grows with the option schema: the same run as far as a resume can tell
            assert inexact_resume_reasons(want.pop("run"), got.pop("run"), optimizer_reuse=True) == []
        want, got = _flat(want), _flat(got)
        assert got.keys() == want.keys(), fname
        label = fname.split("_", 1)[1][:-4]
        inexact = not exact and label in OTHER_KERNELS_REL_L2[name]  # weights, EMA, optimizer moments
        for key, b in want.items():
            a = got[key]
            if not (inexact and isinstance(b, torch.Tensor) and b.is_floating_point()) or key.endswith(".step"):
                assert torch.equal(a, b) if isinstance(b, torch.Tensor) else a == b, (fname, key, a, b)
        if inexact:
            rel = _relative_l2(got, want)
            assert rel <= OTHER_KERNELS_REL_L2[name][label], (fname, rel)
    with open(tmp_path / "experiments" / task / "train.log") as f:
        logged = {m.group(1).replace(",", ""): f"lr:{m.group(2)} {m.group(3)}" for m in FIELDS_RE.finditer(f.read())}
    assert sorted(logged, key=int) == [str(s) for s in range(start + 1, total + 1)]
    if exact:
        assert logged == {s: v for s, v in expected["logged"].items() if int(s) > start}


# ----------------------------------------------------------------------------------------------------------------
# one code path for every unit
# ----------------------------------------------------------------------------------------------------------------
CPU = DistInfo(0, 0, 1, torch.device("cpu"))
TOY_G = {"net_type": "videoconvbaseline", "upscale": 1, "num_feat": 4, "num_block": 1}


class _Teacher(nn.Module):
    """A network that trains beside G (a stand-in for a flow teacher): a per-frame 3x3 convolution."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 3, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x.flatten(0, 1)).view_as(x)


class _ModelWithTeacher(ModelPlain):
    """G and a teacher trained together: the teacher is one declaration."""

    def __init__(self, opt, dist_info):
        super().__init__(opt, dist_info)
        self.add_unit(TrainableUnit("T", _Teacher().to(self.device), "flow teacher"))

    def train_step(self, batches, step):
        g, t = self.units["G"], self.units["T"]
        for unit in self.units.values():
            unit.optimizer.zero_grad(set_to_none=True)
        data = batches[0]
        out = g.train_net(data["L"])
        loss = (out - data["H"]).abs().mean() + (t.train_net(out) - data["H"]).abs().mean()
        self.backward(loss)
        self.step_units([g, t])
        self.log_dict = {"G_loss": float(loss.detach())}


def _opt(tmp_path, model="plain", **train):
    gan = {"F_lossfn_weight": 0, "D_optimizer_reuse": True} if model == "gan" else {}
    base = {"task": "units", "model": model, "scale": 1, "path": {"root": str(tmp_path)}, "datasets": {},
            "netG": dict(TOY_G), "train": {"G_lossfn_type": "l1", "G_optimizer_lr": 1e-2, "G_optimizer_reuse": True,
                                           "E_decay": 0.5, "G_scheduler_periods": 10, **gan, **train}}
    if model == "gan":
        base["netD"] = {"net_type": "discriminator_unet", "base_nc": 4}
    return parse_options(None, base=base)


def _batch(seed: int) -> dict[str, torch.Tensor]:
    lq = torch.rand(1, 2, 3, 16, 16, generator=torch.Generator().manual_seed(seed))
    return {"L": lq, "H": lq * 0.5 + 0.25}


def _teacher_model(tmp_path, seed: int) -> _ModelWithTeacher:
    torch.manual_seed(seed)
    model = _ModelWithTeacher(_opt(tmp_path), CPU)
    model.init_train()
    return model


def _states(model) -> dict[str, torch.Tensor]:
    out = {}
    for label, unit in model.units.items():
        out.update({f"{label}.{k}": v for k, v in unit.net.state_dict().items()})
        state = unit.optimizer.state_dict()
        out.update({f"{label}.opt.{i}.{k}": v for i, s in state["state"].items() for k, v in s.items()})
        out[f"{label}.lr"] = torch.tensor([g["lr"] for g in unit.optimizer.param_groups], dtype=torch.float64)
    return out


def test_a_network_beside_g_is_one_declaration_and_saves_loads_and_resumes_with_g(tmp_path):
    """A third network declared in one line gets its optimizer and schedule (G's settings, its keys being
    absent), its LR every step, its files ``{step}_T.pth``/``{step}_optimizerT.pth``, its resume (a model built
    with other weights continues bit-identically) and ``path.pretrained_netT``."""
    model = _teacher_model(tmp_path, 0)
    assert list(model.units) == ["G", "T"]
    for step in (1, 2):
        model.update_learning_rate(step)
        model.train_step([_batch(step)], step)
    teacher = model.units["T"]
    assert teacher.optimizer.param_groups[0]["lr"] == model.current_learning_rate() == model.scheduler.lr_at(2, 1e-2)
    model.save(2, {"epoch": 0})
    assert sorted(os.listdir(model.models_dir)) == ["2_E.pth", "2_G.pth", "2_T.pth", "2_optimizerG.pth",
                                                    "2_optimizerT.pth", "2_state.pth"]

    resumed = _teacher_model(tmp_path, 7)
    assert not torch.equal(resumed.units["T"].net.conv.weight, teacher.net.conv.weight)
    resumed.resume(2)
    for m in (model, resumed):
        m.update_learning_rate(3)
        m.train_step([_batch(3)], 3)
    a, b = _states(model), _states(resumed)
    assert a.keys() == b.keys() and any(k.startswith("T.opt.") for k in a)
    assert all(torch.equal(a[k], b[k]) for k in a), [k for k in a if not torch.equal(a[k], b[k])][:4]

    fresh = _ModelWithTeacher(_opt(tmp_path), CPU)
    fresh.opt["path"]["pretrained_netT"] = os.path.join(model.models_dir, "2_T.pth")
    fresh.init_train()
    fresh.load_pretrained()
    saved = torch.load(os.path.join(model.models_dir, "2_T.pth"), weights_only=True)["params"]
    assert all(torch.equal(v, saved[k]) for k, v in fresh.units["T"].net.state_dict().items())


def test_a_pretrained_g_without_a_pretrained_e_starts_e_as_its_copy(tmp_path):
    """``path.pretrained_netG`` without ``pretrained_netE``: the EMA copy starts from the loaded G (KAIR), not from
    the random initialisation it was built with."""
    torch.manual_seed(0)
    source = ModelPlain(_opt(tmp_path / "a"), CPU)
    source.init_train()
    source.save(1, {"epoch": 0})
    torch.manual_seed(1)
    model = ModelPlain(_opt(tmp_path / "b"), CPU)
    model.opt["path"]["pretrained_netG"] = os.path.join(source.models_dir, "1_G.pth")
    model.init_train()
    model.load_pretrained()
    g, e = model.units["G"].net.state_dict(), model.units["G"].ema.state_dict()
    assert all(torch.equal(v, source.net_g.state_dict()[k]) and torch.equal(e[k], v) for k, v in g.items())


def test_d_optimizer_files_get_gs_parameter_group_check_and_pretrained_d_is_checked_like_g(tmp_path, caplog):
    """One optimizer load for every unit: a D optimizer file with another number of parameter groups is refused
    (before, only G's was checked); a missing ``path.pretrained_optimizerD`` is refused before anything loads,
    and one set while ``D_optimizer_reuse`` is false is reported, as G's."""
    torch.manual_seed(0)
    model = ModelGAN(_opt(tmp_path, model="gan"), CPU)
    model.init_train()
    model.save(1, {"epoch": 0})
    path = os.path.join(model.models_dir, "1_optimizerD.pth")
    state = torch.load(path, weights_only=True)
    state["param_groups"].append(dict(state["param_groups"][0], params=[]))
    torch.save(state, path)
    with pytest.raises(CheckpointError, match="1_optimizerD.pth holds 2 parameter group.*discriminator's optimizer "
                                              "has 1"):
        model.resume(1)

    opt = _opt(tmp_path, model="gan", D_optimizer_reuse=False)
    opt["path"].update(pretrained_netD=str(tmp_path / "absent.pth"))
    with pytest.raises(CheckpointError, match="path.pretrained_netD = .*absent.pth' does not exist"):
        gan = ModelGAN(opt, CPU)
        gan.init_train()
        gan.load_pretrained()
    opt["path"].update(pretrained_netD=None, pretrained_optimizerD=path)
    gan = ModelGAN(opt, CPU)
    gan.init_train()
    with caplog.at_level(logging.WARNING):
        gan.load_pretrained()
    assert "path.pretrained_optimizerD is set but train.D_optimizer_reuse is false" in caplog.text
    assert not gan.units["D"].optimizer.state_dict()["state"]


def test_fix_iter_rewraps_only_g_under_ddp(tmp_path):
    """The phase change at ``fix_iter`` re-wraps G's DDP (a reducer over the new trainable set) and leaves D's
    wrapper as it is; both train through real (gloo, one process) DDP on either side of it."""
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    try:
        torch.manual_seed(0)
        model = ModelGAN(_opt(tmp_path, model="gan", fix_iter=2, fix_keys=["conv_first"]), CPU)
        model.dist = DistInfo(0, 0, 2, torch.device("cpu"))  # what wrap() reads: "distributed"
        model.init_train()
        g_wrapper, d_wrapper = model.net_g_train, model.units["D"].train_net
        assert isinstance(g_wrapper, DistributedDataParallel) and isinstance(d_wrapper, DistributedDataParallel)
        first = model.net_g.conv_first.weight.detach().clone()
        g_wrappers = [g_wrapper]
        for step in (1, 2):  # step 1 freezes conv_first, step 2 (fix_iter) unfreezes it: G re-wrapped each time
            model.update_learning_rate(step)
            model.train_step([_batch(step)], step)
            g_wrappers.append(model.net_g_train)
            assert torch.equal(model.net_g.conv_first.weight, first) == (step < 2), step
            assert model.units["D"].train_net is d_wrapper, step
        assert len({id(w) for w in g_wrappers}) == 3 and isinstance(g_wrappers[-1], DistributedDataParallel)
    finally:
        dist.destroy_process_group()


def test_an_optimizer_file_is_read_onto_the_cpu_and_its_moments_follow_their_parameters(tmp_path) -> None:
    """A restored optimizer keeps its step counters where a fresh one does (the CPU) and each moment on its
    parameter's device. Read onto a GPU, the counters stayed there and made a non-capturable Adam synchronise with
    the device for every parameter of every step after a resume (seen on an H100). Here the parameters sit on the
    meta device, so the CPU tells which device the file was read onto."""
    src = TrainableUnit("G", nn.Linear(3, 2), "generator")
    src.optimizer = torch.optim.Adam(src.net.parameters(), lr=1e-3)
    src.net(torch.ones(1, 3)).sum().backward()
    src.optimizer.step()
    torch.save(src.optimizer.state_dict(), tmp_path / "optimizerG.pth")
    unit = TrainableUnit("G", nn.Linear(3, 2, device="meta"), "generator")
    unit.optimizer = torch.optim.Adam(unit.net.parameters(), lr=1e-3)
    unit.load_optimizer(str(tmp_path / "optimizerG.pth"))
    states = list(unit.optimizer.state.values())
    assert len(states) == 2
    for state in states:
        assert state["step"].device.type == "cpu" and float(state["step"]) == 1.0
        assert state["exp_avg"].device.type == "meta" and state["exp_avg_sq"].device.type == "meta"
