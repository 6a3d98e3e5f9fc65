"""DDP wrapping without buffer broadcasts (unless running statistics need them) and the multi-tensor EMA update."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.distributed as dist
from torch import nn

from models import model_base, select_network
from models.model_plain import ModelPlain
from tests.support.helpers import BNNet
from utils.utils_dist import DistInfo
from utils.utils_option import parse


@pytest.fixture(autouse=True)
def _register(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(select_network.NETWORKS, 'bnnet', BNNet)


def _model(tmp_path, net: dict, world_size: int = 1, **train) -> ModelPlain:
    base = {'task': 'm', 'model': 'plain', 'scale': 1, 'path': {'root': str(tmp_path)}, 'datasets': {}, 'netG': net,
            'train': {'G_lossfn_type': 'l1', 'G_optimizer_lr': 1e-2, 'manual_seed': 0, **train}}
    torch.manual_seed(0)
    return ModelPlain(parse(None, base=base), DistInfo(0, 0, world_size, torch.device('cpu')))


@pytest.mark.parametrize(('net', 'expected'), [({'net_type': 'bnnet'}, True),
                                               ({'net_type': 'videoconvbaseline', 'upscale': 1}, False)])
def test_ddp_broadcasts_buffers_only_with_running_stats(tmp_path, monkeypatch: pytest.MonkeyPatch, net: dict,
                                                        expected: bool) -> None:
    seen = {}
    monkeypatch.setattr(model_base, 'DistributedDataParallel', lambda module, **kw: seen.update(kw) or module)
    _model(tmp_path, net, world_size=2).wrap()
    assert seen['forward_sync_buffers'] is expected


def test_real_ddp_world_one_without_buffer_broadcast(tmp_path) -> None:
    """The setting reaches a real (gloo, one process) DDP, which trains a step with it."""
    dist.init_process_group('gloo', init_method=f'file://{tmp_path}/store', rank=0, world_size=1)
    try:
        model = _model(tmp_path, {'net_type': 'videoconvbaseline', 'upscale': 1})
        model.dist = DistInfo(0, 0, 2, torch.device('cpu'))  # what wrap() reads: "distributed"
        model.init_train()
        assert isinstance(model.net_g_train, nn.parallel.DistributedDataParallel)
        assert model.net_g_train.forward_sync_buffers is False
        lq = torch.rand(1, 2, 3, 8, 8)
        model.train_step([{'L': lq, 'H': lq}], 1)
        assert model.current_log()['G_loss'] >= 0
    finally:
        dist.destroy_process_group()


def test_ema_update_equals_tensor_by_tensor(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = _model(tmp_path, {'net_type': 'bnnet'}, E_decay=0.999)
    model.init_train()
    model.load_pretrained()
    with torch.no_grad():  # G moves away from E, buffers too
        for p in model.net_g.parameters():
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
        model.net_g.bn.running_mean.add_(1.0)
        model.net_g.bn.num_batches_tracked.add_(3)
        model.net_g.table.mul_(2)
    expected = copy.deepcopy(model.net_e)
    with torch.no_grad():
        for p_e, p_g in zip(expected.parameters(), model.net_g.parameters()):
            p_e.lerp_(p_g, 1.0 - 0.999)
        for b_e, b_g in zip(expected.buffers(), model.net_g.buffers()):
            b_e.copy_(b_g)
    calls = []
    lerp = torch._foreach_lerp_
    monkeypatch.setattr(torch, '_foreach_lerp_', lambda *a: calls.append(len(a[0])) or lerp(*a))
    model.update_E(0.999)
    assert calls == [len(list(model.net_e.parameters()))]  # one multi-tensor call for all parameters
    got, want = model.net_e.state_dict(), expected.state_dict()
    assert got.keys() == want.keys()
    for name in want:
        assert got[name].dtype == want[name].dtype and torch.equal(got[name], want[name]), name
    assert not any(p.requires_grad for p in model.net_e.parameters())
