"""The training model without datasets: losses, EMA, clipping, accumulation, AMP, non-finite loss, fix_iter."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from models import model_base, select_network
from models.loss import CharbonnierLoss, SSIMLoss, define_loss
from models.model_plain import ModelPlain, NonFiniteLossError
from models.model_vrt import ModelVRT
from tests.support.helpers import BNNet
from utils.utils_dist import DistInfo
from utils.utils_option import OptionError, parse

CPU = DistInfo(0, 0, 1, torch.device("cpu"))





def _opt(tmp_path, net=None, **train):
    base = {"task": "m", "model": "vrt", "scale": 1, "path": {"root": str(tmp_path)},
            "datasets": {}, "netG": net or {"net_type": "bnnet"},
            "train": {"G_lossfn_type": "l1", "G_optimizer_lr": 1e-2, "total_iter": 10, "manual_seed": 0, **train}}
    return parse(None, base=base)


@pytest.fixture(autouse=True)
def _register(monkeypatch):
    monkeypatch.setitem(select_network.NETWORKS, "bnnet", BNNet)


def _model(tmp_path, cls=ModelPlain, net=None, **train):
    torch.manual_seed(0)
    model = cls(_opt(tmp_path, net, **train), CPU)
    model.init_train()
    return model


def _batch(b=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    lq = torch.rand(b, 2, 3, 8, 8, generator=g)
    return {"L": lq, "H": (lq * 0.5 + 0.25)}


def _step(model, step, *batches):
    model.update_learning_rate(step)
    model.train_step(batches, step)


def test_losses():
    x, y = torch.zeros(2, 3, 3, 16, 16), torch.full((2, 3, 3, 16, 16), 0.5)
    assert torch.isclose(CharbonnierLoss(1e-9)(x, y), torch.tensor(0.5), atol=1e-6)
    assert torch.isclose(CharbonnierLoss(1e-2)(x, x), torch.tensor(0.1))  # eps inside the square root
    ssim = SSIMLoss()
    img = torch.rand(1, 2, 3, 32, 32)
    assert ssim(img, img).abs() < 1e-6  # 1 - SSIM: zero for identical videos (5-D input)
    assert ssim(img, torch.rand(1, 2, 3, 32, 32)) > 0.5
    with pytest.raises(KeyError, match="G_lossfn_type='huber'"):
        define_loss({"G_lossfn_type": "huber"})


def test_accumulation_equals_larger_batch(tmp_path):
    net = {"net_type": "videoconvbaseline", "upscale": 1, "num_feat": 4, "num_block": 1}  # no BatchNorm
    big = _model(tmp_path, net=net)
    acc = _model(tmp_path, net=net, grad_accum_steps=2)
    data = _batch(2)
    _step(big, 1, data)
    _step(acc, 1, {"L": data["L"][:1], "H": data["H"][:1]}, {"L": data["L"][1:], "H": data["H"][1:]})
    for p, q in zip(big.net_g.parameters(), acc.net_g.parameters()):
        assert torch.allclose(p, q, atol=1e-6)


def test_gradient_clipping_works(tmp_path):
    model = _model(tmp_path, G_optimizer_clipgrad=1e-4)
    _step(model, 1, _batch())
    norm = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in model.net_g.parameters()]))
    assert norm <= 1e-4 * 1.001


def test_ema_copies_buffers_and_averages_params(tmp_path):
    model = _model(tmp_path, E_decay=0.5)
    model.load_pretrained()  # no pretrained E: E starts as a copy of G
    before = copy.deepcopy(model.net_e.state_dict())
    _step(model, 1, _batch())
    g, e = model.net_g.state_dict(), model.net_e.state_dict()
    assert torch.allclose(e["conv_first.weight"], 0.5 * before["conv_first.weight"] + 0.5 * g["conv_first.weight"])
    assert torch.equal(e["bn.running_mean"], g["bn.running_mean"]) and not torch.equal(e["bn.running_mean"],
                                                                                         before["bn.running_mean"])
    assert model.eval_network() is model.net_e


def test_non_finite_loss_stops_with_clear_message(tmp_path):
    model = _model(tmp_path)
    data = _batch()
    data["L"][0, 0, 0, 0, 0] = float("nan")
    with pytest.raises(NonFiniteLossError, match="non-finite loss .* at step 1; the last complete checkpoint is none"):
        _step(model, 1, data)


def test_bf16_autocast_step(tmp_path):
    model = _model(tmp_path, amp="bf16")
    _step(model, 1, _batch())
    assert torch.isfinite(torch.tensor(model.current_log()["G_loss"]))


def test_fix_iter_freezes_then_unfreezes(tmp_path):
    model = _model(tmp_path, cls=ModelVRT, fix_iter=3, fix_keys=["conv_first"], fix_lr_mul=0.125)
    lrs = [g["lr"] for g in model.optimizer.param_groups]
    assert lrs[1] == pytest.approx(lrs[0] * 0.125)
    first = model.net_g.conv_first.weight.detach().clone()
    last = model.net_g.conv_last.weight.detach().clone()
    for step in (1, 2):
        _step(model, step, _batch(seed=step))
    assert torch.equal(model.net_g.conv_first.weight, first)  # frozen before fix_iter
    assert not torch.equal(model.net_g.conv_last.weight, last)
    _step(model, 3, _batch(seed=3))
    assert not torch.equal(model.net_g.conv_first.weight, first)  # updated from fix_iter on
    assert model.optimizer.param_groups[1]["lr"] == pytest.approx(model.optimizer.param_groups[0]["lr"] * 0.125)


def test_fix_iter_minus_one_keeps_multiplier_and_freezes_nothing(tmp_path):
    model = _model(tmp_path, cls=ModelVRT, fix_iter=-1, fix_keys=["conv_first"], fix_lr_mul=0.25)
    first = model.net_g.conv_first.weight.detach().clone()
    _step(model, 1, _batch())
    assert not torch.equal(model.net_g.conv_first.weight, first)
    assert model.optimizer.param_groups[1]["lr"] == pytest.approx(model.optimizer.param_groups[0]["lr"] * 0.25)


def test_sync_bn_conversion_under_ddp(tmp_path, monkeypatch):
    monkeypatch.setattr(model_base, "DistributedDataParallel", lambda net, **kw: net)
    model = ModelPlain(_opt(tmp_path), DistInfo(0, 0, 2, torch.device("cpu")))
    model.opt = dict(model.opt, sync_bn=True)
    model.wrap()
    assert isinstance(model.net_g.bn, nn.SyncBatchNorm)


def test_unknown_netg_key_names_closest(tmp_path):
    with pytest.raises(OptionError, match="unknown option 'netG.upscal'; did you mean 'upscale'"):
        select_network.define_network("videoconvbaseline", {"upscal": 4})
    with pytest.raises(OptionError, match="net_type' = 'nope' is unknown; registered: .*rvrt, videoconvbaseline, vrt"):
        select_network.define_network("nope", {})
    with pytest.raises(OptionError, match="'netG.embed_dims' must be list, got int"):
        select_network.define_network("vrt", {"embed_dims": 16})
