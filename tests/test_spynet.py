"""SpyNet and flow_warp: reference golden flows, warping semantics, weight loading."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from models.layers_warp import flow_warp
from models.network_spynet import SPYNET_URL, SpyNet
from tests.support.golden import deterministic_fill

FIXTURES = Path(__file__).parent / 'fixtures' / 'vrt'


def test_state_dict_names() -> None:
    sd = SpyNet().state_dict()
    expected = {f'basic_module.{i}.basic_module.{j}.{p}' for i in range(6) for j in (0, 2, 4, 6, 8)
                for p in ('weight', 'bias')} | {'mean', 'std'}
    assert set(sd) == expected
    assert sd['basic_module.0.basic_module.0.weight'].shape == (32, 8, 7, 7)
    assert sd['basic_module.5.basic_module.8.weight'].shape == (2, 16, 7, 7)


def test_golden_flows_match_reference() -> None:
    data = torch.load(FIXTURES / 'golden_spynet.pt', weights_only=True)
    net = SpyNet(return_levels=data['return_levels'])
    deterministic_fill(net, data['fill_seed'])
    flows = net(data['ref'], data['supp'])
    assert len(flows) == 4
    for ours, ref in zip(flows, data['flows']):
        torch.testing.assert_close(ours, ref, atol=1e-5, rtol=1e-5)
    single = SpyNet(return_levels=(5,))
    single.load_state_dict(net.state_dict())
    torch.testing.assert_close(single(data['ref'], data['supp']), data['flows'][0], atol=1e-5, rtol=1e-5)


def test_flow_warp_semantics() -> None:
    x = torch.rand(2, 3, 10, 12)
    zero = torch.zeros(2, 10, 12, 2)
    torch.testing.assert_close(flow_warp(x, zero), x)
    shift = zero.clone()
    shift[..., 0] = 1.0  # sample one pixel to the right
    out = flow_warp(x, shift)
    torch.testing.assert_close(out[..., :-1], x[..., 1:])
    assert out[..., -1].abs().max() == 0  # zeros padding
    half = zero + 0.5
    n4 = flow_warp(x, half, 'nearest4')
    assert n4.shape == (2, 12, 10, 12)
    torch.testing.assert_close(n4[:, 0:3], x)  # floor/floor
    torch.testing.assert_close(n4[:, 9:12, :-1, :-1], x[:, :, 1:, 1:])  # ceil/ceil
    torch.testing.assert_close(n4[:, 3:6, :-1], x[:, :, 1:])  # x floor, y ceil


def test_flow_warp_keeps_dtype_and_nearest4_has_no_flow_gradient() -> None:
    x = torch.rand(1, 2, 8, 8, dtype=torch.bfloat16)
    assert flow_warp(x, torch.zeros(1, 8, 8, 2)).dtype == torch.bfloat16
    flow = torch.full((1, 8, 8, 2), 0.3, requires_grad=True)
    xf = torch.rand(1, 2, 8, 8, requires_grad=True)
    flow_warp(xf, flow, 'nearest4').sum().backward()
    assert flow.grad is None or not flow.grad.any()
    assert xf.grad is not None and xf.grad.any()


def test_missing_weights_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError) as info:
        SpyNet(tmp_path / 'spynet.pth')
    assert SPYNET_URL in str(info.value) and 'download_spynet.py' in str(info.value)


def test_loads_params_file_without_buffers(tmp_path: Path) -> None:
    src = SpyNet()
    deterministic_fill(src, seed=7)
    params = {k: v for k, v in src.state_dict().items() if k not in ('mean', 'std')}
    torch.save({'params': params}, tmp_path / 'spy.pth')
    net = SpyNet(tmp_path / 'spy.pth')
    for k, v in src.state_dict().items():
        torch.testing.assert_close(net.state_dict()[k], v)
    torch.save({'weights': params}, tmp_path / 'bad.pth')
    with pytest.raises(KeyError, match='params'):
        SpyNet(tmp_path / 'bad.pth')


def test_rejects_small_or_mismatched_inputs() -> None:
    net = SpyNet()
    with pytest.raises(ValueError, match='above 32'):
        net(torch.rand(1, 3, 32, 64), torch.rand(1, 3, 32, 64))
    with pytest.raises(ValueError, match='differ'):
        net(torch.rand(1, 3, 64, 64), torch.rand(1, 3, 64, 72))
    with pytest.raises(ValueError, match='return_levels'):
        SpyNet(return_levels=(6,))
