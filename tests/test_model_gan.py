"""The GAN model without processes: the U-Net discriminator and its spectral normalisation, the adversarial and
perceptual losses (VGG19 weights generated here; nothing downloads), the step schedule (warm-up, D-only steps,
D_update_ratio), the log fields and the checkpoint files of G and D."""

from __future__ import annotations

import copy
import hashlib
import os

import pytest
import torch
from torch import nn

from engine.options import parse_options
from models import model_gan
from models.loss import GANLoss, PerceptualLoss, VGGFeatureExtractor
from models.model_gan import ModelGAN, fetch_vgg19
from models.network_discriminator import UNetDiscriminatorSN, define_D
from scripts.download_vgg import main as download_vgg_main
from tests.support.helpers import TINY_OPT
from utils import utils_checkpoint as ckpt
from utils.utils_dist import DistInfo
from utils.utils_option import OptionError

CPU = DistInfo(0, 0, 1, torch.device("cpu"))


def _vgg_file(path, last_layer: int = 7, seed: int = 1) -> str:
    """A torchvision-style VGG19 state dict (``features.*``) with generated weights up to ``last_layer``."""
    from torchvision.models.vgg import cfgs, make_layers

    torch.manual_seed(seed)
    features = make_layers(cfgs["E"])[: last_layer + 1]
    torch.save({f"features.{k}": v for k, v in features.state_dict().items()}, path)
    return str(path)


def _opt(tmp_path, **train):
    base = copy.deepcopy(TINY_OPT)
    base.update(model="gan", scale=1, datasets={}, netD={"net_type": "discriminator_unet", "base_nc": 4})
    base["path"]["root"] = str(tmp_path)
    base["netG"] = {"net_type": "videoconvbaseline", "upscale": 1, "num_feat": 4, "num_block": 1}
    base["train"].update({"F_feature_layer": [2, 7], "F_weights": [0.1, 1.0], "D_optimizer_reuse": True,
                          "F_vgg19_path": _vgg_file(tmp_path / "vgg.pth"), "E_decay": 0.5, **train})
    return parse_options(None, base=base)


def _model(tmp_path, **train) -> ModelGAN:
    torch.manual_seed(0)
    model = ModelGAN(_opt(tmp_path, **train), CPU)
    model.init_train()
    model.load_pretrained()
    return model


def _batch(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    lq = torch.rand(1, 2, 3, 16, 16, generator=g)
    return {"L": lq, "H": lq * 0.5 + 0.25}


def _step(model: ModelGAN, step: int) -> None:
    model.update_learning_rate(step)
    model.train_step([_batch(2 * step), _batch(2 * step + 1)], step)


def _snapshot(model: ModelGAN) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    return ({k: v.clone() for k, v in model.net_g.state_dict().items()},
            {k: v.clone() for k, v in model.net_d.state_dict().items()})


def _changed(before: dict[str, torch.Tensor], after: dict[str, torch.Tensor]) -> set[str]:
    return {k for k in before if not torch.equal(before[k], after[k])}


# ----------------------------------------------------------------------------------------------- discriminator
def test_unet_discriminator_judges_each_frame_and_keeps_real_esrgans_layout():
    torch.manual_seed(0)
    net = UNetDiscriminatorSN(in_nc=3, base_nc=4)
    clips = torch.rand(2, 3, 3, 16, 24)
    out = net(clips)
    assert out.shape == (2, 3, 1, 16, 24)
    frame = net(clips[1, 2:3])  # a frame alone gets the same logits as inside its clip
    assert torch.allclose(out[1, 2], frame[0], atol=1e-6)
    names = net.state_dict().keys()
    normalised = [f"conv{i}" for i in range(1, 9)]
    assert all(f"{c}.parametrizations.weight.original" in names and f"{c}.parametrizations.weight.0._u" in names
               for c in normalised)
    assert "conv0.bias" in names and "conv9.bias" in names and "conv1.bias" not in names
    with pytest.raises(ValueError, match="divisible by 8, got 12x24"):
        net(torch.rand(1, 3, 12, 24))


def test_spectral_norm_iterates_only_when_asked_and_reaches_unit_norm():
    torch.manual_seed(0)
    net = UNetDiscriminatorSN(base_nc=4).train()
    u = net.conv3.parametrizations.weight[0]._u.clone()
    net(torch.rand(1, 3, 16, 16)).sum().backward()  # a training forward and backward leave the vectors alone
    assert torch.equal(net.conv3.parametrizations.weight[0]._u, u)
    net.power_iteration()
    assert not torch.equal(net.conv3.parametrizations.weight[0]._u, u)
    assert not any(m.training for m in net.conv3.parametrizations.weight.modules())  # forwards never iterate
    for _ in range(200):
        net.power_iteration()
    for i in range(1, 9):
        weight = getattr(net, f"conv{i}").weight.detach()
        assert torch.linalg.matrix_norm(weight.flatten(1), ord=2) == pytest.approx(1.0, abs=1e-3), i


def test_orthogonal_init_and_define_d_errors():
    torch.manual_seed(0)
    net = define_D({"netD": {"net_type": "discriminator_unet", "base_nc": 4, "init_type": "orthogonal",
                             "init_gain": 0.2, "n_layers": 3, "norm_type": "spectral"}})  # KAIR's PatchGAN keys
    w = net.conv0.weight.detach().flatten(1)
    assert torch.allclose(w @ w.T, 0.04 * torch.eye(4), atol=1e-5) and torch.equal(net.conv0.bias, torch.zeros(4))
    with pytest.raises(KeyError, match="gan.* needs a .*netD.* section with a net_type"):
        define_D({"model": "gan"})
    with pytest.raises(KeyError, match="registered: \\['discriminator_unet'\\]"):
        define_D({"netD": {"net_type": "discriminator_patchgan"}})


# ----------------------------------------------------------------------------------------------- losses
def test_gan_losses_match_their_definitions():
    zero, two = torch.zeros(2, 1, 4, 4), torch.full((2, 1, 4, 4), 2.0)
    log2 = torch.log(torch.tensor(2.0))
    assert torch.allclose(GANLoss("gan").generator_loss(zero), log2)
    real, fake = GANLoss("gan").discriminator_loss(two, -two)
    assert torch.allclose(real, torch.log1p(torch.exp(-two[0, 0, 0, 0]))) and torch.allclose(real, fake)
    assert GANLoss("lsgan").discriminator_loss(two, two) == (1.0, 4.0)
    assert GANLoss("lsgan").generator_loss(two) == 1.0
    assert GANLoss("hinge").discriminator_loss(two * 0.25, two) == (0.5, 3.0)
    assert GANLoss("hinge").generator_loss(two) == -2.0
    assert GANLoss("wgan").discriminator_loss(two, two) == (-2.0, 2.0)
    # relativistic: only the difference from the other side's mean matters
    ragan = GANLoss("ragan")
    assert torch.allclose(ragan.generator_loss(two, two), log2)
    d_real, d_fake = ragan.discriminator_loss(two + 3, two)
    assert torch.allclose(d_real, 0.5 * torch.log1p(torch.exp(torch.tensor(-3.0))))
    assert torch.allclose(d_fake, d_real)
    with pytest.raises(KeyError, match="train.gan_type='wgangp' is unknown"):
        GANLoss("wgangp")


def test_perceptual_loss_on_generated_vgg19_weights(tmp_path):
    path = _vgg_file(tmp_path / "vgg.pth", last_layer=7)
    loss = PerceptualLoss([7, 2], [1.0, 0.1])
    loss.vgg.load_vgg19(path)
    state = torch.load(path, weights_only=True)
    assert torch.equal(loss.vgg.features[7].weight, state["features.7.weight"])
    assert len(loss.vgg.features) == 8 and loss.weights == [0.1, 1.0]  # truncated; weights follow layer order
    x = torch.rand(1, 2, 3, 16, 16, requires_grad=True)
    assert loss(x.detach(), x.detach()) == 0
    value = loss(x, torch.rand(1, 2, 3, 16, 16))
    value.backward()
    assert value > 0 and x.grad.abs().sum() > 0
    assert all(p.grad is None and not p.requires_grad for p in loss.vgg.parameters())
    # the kept conv2_2 output is the pre-activation one (negative values survive the next ReLU)
    assert min(float(f.min()) for f in loss.vgg(torch.rand(1, 3, 16, 16))) < 0
    with pytest.raises(KeyError, match="features.10.weight is missing"):
        VGGFeatureExtractor([10]).load_vgg19(path)
    with pytest.raises(ValueError, match="F_weights has 3 value"):
        PerceptualLoss([2, 7], [1.0, 1.0, 1.0])
    with pytest.raises(FileNotFoundError, match="scripts/download_vgg.py"):
        VGGFeatureExtractor([2]).load_vgg19(str(tmp_path / "absent.pth"))


def test_vgg19_fetch_is_sha256_checked_and_offline_is_a_clear_error(tmp_path, monkeypatch):
    source = _vgg_file(tmp_path / "source.pth")
    digest = hashlib.sha256(open(source, "rb").read()).hexdigest()
    monkeypatch.setattr(model_gan, "VGG19_URL", f"file://{source}")
    monkeypatch.setattr(model_gan, "VGG19_SHA256_PREFIX", digest[:8])
    dest = tmp_path / "zoo" / "vgg19.pth"
    fetch_vgg19(str(dest))
    assert dest.read_bytes() == open(source, "rb").read()
    monkeypatch.setattr(model_gan, "VGG19_SHA256_PREFIX", "00000000")
    with pytest.raises(FileNotFoundError, match="could not be fetched: Checksum mismatch"):
        fetch_vgg19(str(tmp_path / "zoo" / "other.pth"))
    assert not (tmp_path / "zoo" / "other.pth").exists()
    # the script checks against torchvision's digest prefix: a file that is not torchvision's is refused
    assert download_vgg_main(["--out", str(tmp_path / "s.pth"), "--url", f"file://{source}"]) == 1
    assert not (tmp_path / "s.pth").exists()


# ----------------------------------------------------------------------------------------------- the model
def test_schedule_warmup_d_only_steps_and_log_fields(tmp_path):
    model = _model(tmp_path, gan_warmup_iter=1, D_init_iters=2, D_update_ratio=2)
    expected = {1: (True, False), 2: (False, True), 3: (False, True), 4: (True, True), 5: (False, True)}
    for step, (update_g, update_d) in expected.items():
        assert model.schedule(step) == (update_g, update_d)
        g, d = _snapshot(model)
        e = {k: v.clone() for k, v in model.net_e.state_dict().items()}
        _step(model, step)
        g2, d2 = _snapshot(model)
        assert bool(_changed(g, g2)) == update_g, step
        assert bool(_changed(d, d2)) == update_d, step
        assert bool({k for k in e if not torch.equal(e[k], model.net_e.state_dict()[k])}), step  # EMA every step
        fields = list(model.current_log())
        want = ["G_loss"] + ["F_loss"] * update_g + ["D_loss"] * (update_g and update_d)
        want += ["D_real", "D_fake", "l_d_real", "l_d_fake"] * update_d
        assert fields == want, step
        assert all(torch.isfinite(torch.tensor(v)) for v in model.current_log().values())


def test_generator_step_leaves_discriminator_gradients_alone(tmp_path, monkeypatch):
    model = _model(tmp_path)
    seen = {}
    real_step = model.optimizer_steps

    def spy(update_g, update_d):
        seen["d_grads"] = [p.grad.clone() for p in model.net_d.parameters()]
        seen["g_grads"] = [p.grad is not None for p in model.net_g.parameters()]
        real_step(update_g, update_d)

    monkeypatch.setattr(model, "optimizer_steps", spy)
    _step(model, 1)
    assert all(seen["g_grads"])
    # D's gradient is that of its own loss alone: recompute it from the same inputs
    reference = _model(tmp_path)
    reference.net_d.power_iteration()
    for data, last in ((_batch(2), False), (_batch(3), True)):
        with torch.no_grad():
            fake = reference.net_g(data["L"])
        pred = reference.net_d(torch.cat([data["H"], fake]))
        l_real, l_fake = reference.gan_loss.discriminator_loss(*pred.chunk(2))
        ((l_real + l_fake) / 2).backward()
    for got, want in zip(seen["d_grads"], [p.grad for p in reference.net_d.parameters()]):
        assert torch.allclose(got, want, atol=1e-7)


def test_checkpoint_holds_d_and_its_optimizer_and_resume_continues_exactly(tmp_path):
    model = _model(tmp_path, D_scheduler_type="MultiStepLR", D_scheduler_milestones=[2], D_scheduler_gamma=0.5)
    for step in (1, 2):
        _step(model, step)
    model.save(2, {"epoch": 0})
    models = model.models_dir
    files = sorted(os.listdir(models))
    assert files == ["2_D.pth", "2_E.pth", "2_G.pth", "2_optimizerD.pth", "2_optimizerG.pth", "2_state.pth"]
    saved_d = ckpt.safe_load(os.path.join(models, "2_D.pth"))["params"]
    assert "conv1.parametrizations.weight.0._u" in saved_d  # the power-iteration state travels with D
    assert "scheduler_D" not in ckpt.safe_load(os.path.join(models, "2_state.pth"))  # D's LR: the closed form
    assert model.units["D"].optimizer.param_groups[0]["lr"] == pytest.approx(0.5e-4)

    resumed = ModelGAN(_opt(tmp_path, D_scheduler_type="MultiStepLR", D_scheduler_milestones=[2],
                            D_scheduler_gamma=0.5), CPU)
    resumed.init_train()
    resumed.resume(2)
    assert resumed.units["D"].optimizer.param_groups[0]["lr"] == pytest.approx(0.5e-4)
    assert resumed.units["D"].optimizer.state_dict()["state"].keys() == \
        model.units["D"].optimizer.state_dict()["state"].keys()
    torch.manual_seed(5)
    _step(model, 3)
    torch.manual_seed(5)
    _step(resumed, 3)
    for a, b in zip((model.net_g, model.net_d, model.net_e), (resumed.net_g, resumed.net_d, resumed.net_e)):
        assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
    assert model.current_log() == resumed.current_log()

    os.remove(os.path.join(models, "2_optimizerD.pth"))  # with D_optimizer_reuse: an error, not a fresh optimizer
    with pytest.raises(ckpt.CheckpointError, match="2_optimizerD.pth is missing: step 2 .* is incomplete"):
        resumed.resume(2)
    no_reuse = ModelGAN(_opt(tmp_path, D_optimizer_reuse=False, D_scheduler_type="MultiStepLR",
                             D_scheduler_milestones=[2], D_scheduler_gamma=0.5), CPU)
    no_reuse.init_train()
    no_reuse.resume(2)  # KAIR's meaning: D's optimizer starts afresh (logged as not bit-exact), at step 2's LR
    assert not no_reuse.units["D"].optimizer.state_dict()["state"]
    assert no_reuse.units["D"].optimizer.param_groups[0]["lr"] == pytest.approx(0.5e-4)
    os.remove(os.path.join(models, "2_D.pth"))
    with pytest.raises(ckpt.CheckpointError, match="2_D.pth is missing: step 2 .* was not saved by model 'gan'"):
        resumed.resume(2)
    os.remove(os.path.join(models, "2_optimizerG.pth"))  # G's optimizer likewise (ModelBase.resume)
    with pytest.raises(ckpt.CheckpointError, match="2_optimizerG.pth is missing: step 2 .* is incomplete"):
        resumed.resume(2)


def _flat_optimizer(optimizer: torch.optim.Optimizer) -> dict[str, torch.Tensor]:
    return {f"{i}.{k}": v for i, st in optimizer.state_dict()["state"].items() for k, v in st.items()}


def test_bf16_accumulated_gan_run_saved_and_resumed_equals_the_uninterrupted_run(tmp_path):
    """Under bf16 autocast, 2 accumulated micro-batches a step, D alone at step 1, perceptual loss on: 4 steps
    straight, against 2 steps, a checkpoint, a model built with other weights resumed from it, 2 more steps. G, EMA,
    D (spectral-norm vectors included), both optimizers and their learning rates, and every logged number are the
    same bits. The loop's RNG restore is stood in for by reseeding before each step. (The toy G: the tiny VRT takes
    about 100 s per bf16 step on a 2-core CPU; the real-process GAN runs in test_gan_exactness.py use the VRT.)"""
    train = {"amp": "bf16", "D_init_iters": 1, "D_scheduler_type": "MultiStepLR", "D_scheduler_milestones": [3],
             "D_scheduler_gamma": 0.5}

    def build(init_seed: int) -> ModelGAN:
        opt = _opt(tmp_path, **train)
        torch.manual_seed(init_seed)
        model = ModelGAN(opt, CPU)
        model.init_train()
        return model

    def run(model: ModelGAN, steps: range) -> list[dict[str, float]]:
        logs = []
        for step in steps:
            torch.manual_seed(1000 + step)
            model.update_learning_rate(step)
            model.train_step([_batch(2 * step), _batch(2 * step + 1)], step)
            logs.append(dict(model.current_log()))
        return logs

    straight = build(0)
    logs = run(straight, range(1, 5))
    assert "D_loss" not in logs[0] and "D_loss" in logs[2]
    first = build(0)
    assert run(first, range(1, 3)) == logs[:2]
    first.save(2, {"epoch": 0})
    resumed = build(7)
    assert not torch.equal(next(iter(resumed.net_g.parameters())), next(iter(first.net_g.parameters())))
    resumed.resume(2)
    assert run(resumed, range(3, 5)) == logs[2:]
    for a, b in ((straight.net_g, resumed.net_g), (straight.net_e, resumed.net_e), (straight.net_d, resumed.net_d)):
        sa, sb = a.state_dict(), b.state_dict()
        assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa), type(a).__name__
    for a, b in ((straight.optimizer, resumed.optimizer),
                 (straight.units["D"].optimizer, resumed.units["D"].optimizer)):
        fa, fb = _flat_optimizer(a), _flat_optimizer(b)
        assert fa.keys() == fb.keys() and fa and all(torch.equal(fa[k], fb[k]) for k in fa)
        assert [g["lr"] for g in a.param_groups] == [g["lr"] for g in b.param_groups]
    assert straight.units["D"].optimizer.param_groups[0]["lr"] == pytest.approx(0.5 * 1e-4)  # D's milestone crossed


def test_options_of_the_gan_model(tmp_path):
    opt = _opt(tmp_path)
    t = opt["train"]
    assert (t["gan_type"], t["D_lossfn_weight"], t["D_update_ratio"], t["D_init_iters"]) == ("gan", 0.1, 1, 0)
    assert (t["F_lossfn_type"], t["F_use_input_norm"], t["F_use_range_norm"]) == ("l1", True, False)
    assert opt["netD"] == {"net_type": "discriminator_unet", "base_nc": 4}
    model = ModelGAN(opt, CPU)
    model.init_train()
    assert model.units["D"].optimizer.param_groups[0]["betas"] == tuple(t["G_optimizer_betas"])  # null: G's
    scheduler_d = model.units["D"].scheduler
    assert scheduler_d.kind == t["G_scheduler_type"] and scheduler_d.periods == t["G_scheduler_periods"]
    base = {"task": "x", "model": "gan", "netG": {"net_type": "vrt"}, "netD": {"base_ncc": 8}}
    with pytest.raises(OptionError, match="unknown option 'netD.base_ncc'; did you mean 'base_nc'"):
        parse_options(None, base=base)
    with pytest.raises(OptionError, match="'train.gan_type' = 'wgan-gp' is not one of"):
        parse_options(None, base={**base, "netD": {}, "train": {"gan_type": "wgan-gp"}})


def test_no_perceptual_loss_needs_no_vgg19(tmp_path):
    model = _model(tmp_path, F_lossfn_weight=0, F_vgg19_path=str(tmp_path / "absent.pth"))
    assert model.perceptual is None
    _step(model, 1)
    assert "F_loss" not in model.current_log()
    assert isinstance(model.units["D"].train_net, nn.Module)


@pytest.mark.parametrize("amp", ["bf16", "fp16"])
def test_autocast_steps_update_both_networks(tmp_path, amp):
    model = _model(tmp_path, amp=amp, F_lossfn_weight=0)
    g, d = _snapshot(model)
    _step(model, 1)
    g2, d2 = _snapshot(model)
    assert _changed(g, g2) and _changed(d, d2)
    assert all(torch.isfinite(torch.tensor(v)) for v in model.current_log().values())
    assert (model.scaler_state() is not None) == (amp == "fp16")  # one scaler for both optimizers, checkpointed


def test_netd_option_docs_state_the_constructor_defaults():
    """The netD keys' documented defaults are the constructor's (the one place they are set)."""
    import inspect

    from utils.utils_option_schema import SCHEMA

    params = inspect.signature(UNetDiscriminatorSN).parameters
    for key in ("in_nc", "base_nc", "skip_connection", "init_type", "init_gain"):
        default = params[key].default
        shown = str(default).lower() if isinstance(default, bool) else default
        assert f"Default: `{shown}`." in SCHEMA[f"netD.{key}"].doc, key
