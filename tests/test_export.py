"""``scripts/export.py`` to ONNX: every registered network (and VRT's denoising and interpolation modes) exports,
passes the ONNX checker and runs in ONNX Runtime as in PyTorch; the metadata describes the input; height and width
are dynamic only where tracing froze no size-dependent branch, and a tile the graph was not built for is refused
with one line."""

from __future__ import annotations

import copy
import json
import logging
import math
import sys

import pytest
import torch

from models.onnx_runner import MISSING_ORT, OnnxNetwork, TileMismatch
from models.select_network import NETWORKS, define_network, network_kwargs
from scripts import export
from tests.support.helpers import TINY_OPT
from tests.support.networks import TINY_NETS, tiny_net

onnx = pytest.importorskip("onnx")  # the optional export extra (requirements-dev.txt installs it)
pytest.importorskip("onnxruntime")

# Every registered network in its x4 form, and the task forms whose graphs take or give something else: frame
# interpolation (T frames in, one out: VRT), full-resolution output (VRT's deblurring reconstruction, the conv
# baseline's) and the noise-level map input (the conv baseline; VRT's denoiser is exported, checked within 1e-4 and
# evaluated by tests/test_onnx_eval.py). A tiny VRT, RVRT or BasicVSR++ export takes 15-70 s on 2 shared cores, so
# the remaining (network, form) pairs of tests.support.networks.CASES, the same inputs and outputs through larger
# graphs (RVRT's and BasicVSR++'s full-resolution forms need frames of 132+ pixels), are not exported here;
# tests/test_registered_networks.py runs them in PyTorch.
FORM_CASES = {"vrt_vfi": ("vrt", "vfi", [2, 40, 40]), "vrt_deblur": ("vrt", "deblur", None),
              "videoconvbaseline_denoise": ("videoconvbaseline", "denoise", None),
              "videoconvbaseline_deblur": ("videoconvbaseline", "deblur", None)}
# VRT with three blocks in stage 1 (the second shifted, both with mutual attention) and RVRT with two Swin blocks in
# its first part (the second shifted): the tiny nets' one block per stage never shifts, so a graph without the shift
# mask passed. Without the mask the graph is 8.6e-4 (VRT) and 5.9e-3 (RVRT) off PyTorch.
SHIFTED = {"vrt": {"depths": [3, 1, 1, 1, 1, 1, 1, 1]}, "rvrt": {"depths": [2, 1, 1]}}
CASES = {**{name: TINY_NETS.get(name) and {**TINY_NETS[name], **SHIFTED.get(name, {})} for name in NETWORKS},
         **{name: {**tiny_net(net, form), **({"img_size": size} if size else {})}
            for name, (net, form, size) in FORM_CASES.items()}}
# |ONNX Runtime - PyTorch| measured on every case (Sapphire Rapids, AVX-512): 1.2e-7 .. 4.8e-7 (VRT's deblurring
# form), 2.2e-5 for VRT's frame interpolation; about 10x the largest for other CPUs' summation orders, 4.6x for VFI
# (benchmarks/RESULTS.md, "Test tolerances from measured errors")
FP32_TOL = 5e-6
TOL = {"vrt_vfi": 1e-4}


def _net(netg: dict) -> torch.nn.Module:
    torch.manual_seed(0)
    return define_network(netg["net_type"], network_kwargs({k: v for k, v in netg.items() if k != "net_type"}))


def _experiment(tmp_path, name: str, netg: dict) -> tuple[str, torch.nn.Module]:
    """An option file of ``netg`` and a checkpoint of random weights (its newest)."""
    opt = copy.deepcopy(TINY_OPT)
    opt.update(task=name, netG=netg)
    opt["path"]["root"] = str(tmp_path / "experiments")
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(opt))
    net = _net(netg).eval()
    models = tmp_path / "experiments" / name / "models"
    models.mkdir(parents=True)
    torch.save({"params": net.state_dict()}, models / "5_G.pth")
    return str(path), net


def _tile(net: torch.nn.Module, frames: int = 2, size: int = 40) -> tuple[int, int, int]:
    _, mh, mw = net.io.input_multiple
    size = max(size, net.io.min_size)  # IART takes 64+ pixels
    return frames, math.ceil(size / mh) * mh, math.ceil(size / mw) * mw


def _input(net: torch.nn.Module, tile: tuple[int, int, int], seed: int) -> torch.Tensor:
    x = torch.rand(1, tile[0], net.io.in_chans, *tile[1:], generator=torch.Generator().manual_seed(seed))
    if net.io.noise_map:
        x[:, :, -1] = 0.2
    return x


def _diff(runner: OnnxNetwork, net: torch.nn.Module, x: torch.Tensor) -> float:
    with torch.no_grad():
        return float((runner(x) - net(x)).abs().max())


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_network_exports_and_runs_in_onnx_runtime_as_in_pytorch(name, tmp_path, capsys, one_thread):
    netg = CASES[name]
    assert netg is not None, f"{name} is registered in NETWORKS but has no tiny netG in TINY_NETS"
    opt, net = _experiment(tmp_path, name, netg)
    tile = _tile(net)
    out = str(tmp_path / f"{name}.onnx")
    code = export.main(["--opt", opt, "--tile", *map(str, tile), "--out", out])
    printed = capsys.readouterr().out
    assert code == 0, printed
    assert "ONNX checker: ok" in printed and "max |ONNX Runtime - PyTorch|" in printed
    onnx.checker.check_model(out)
    meta = {p.key: p.value for p in onnx.load(out, load_external_data=False).metadata_props}
    io = net.io
    assert meta["scale"] == str(io.scale) and meta["in_chans"] == str(io.in_chans)
    assert meta["tile"] == ",".join(map(str, tile)) and meta["layout"] == "NTCHW" and meta["value_range"] == "0,1"
    assert meta["sigma_channel"] == (str(io.in_chans - 1) if io.noise_map else "none")
    assert meta["frame_interpolation"] == str(int(io.frame_interpolation))
    assert json.loads(meta["netG"]) == netg
    runner = OnnxNetwork(out, providers=["CPUExecutionProvider"])
    assert runner.io == io
    x = _input(net, tile, seed=5)  # not the exporter's own input
    tol = TOL.get(name, FP32_TOL)
    assert _diff(runner, net, x) <= tol
    # a mirror-extended clip (frame i == frame T-1-i), where RVRT's PyTorch forward takes its mirrored-flow branch
    # and the graph, traced on a random clip, computes both flow directions
    half = x[:, : (tile[0] + 1) // 2]
    assert _diff(runner, net, torch.cat([half, half.flip(1)], 1)[:, : tile[0]]) <= tol
    if runner.tile.dynamic_hw:  # another allowed size runs, and equals PyTorch
        mh, mw = runner.tile.hw_multiple
        assert _diff(runner, net, _input(net, (tile[0], tile[1] + 3 * mh, tile[2] + mw), seed=6)) <= tol
    else:  # a size the graph was not built for is refused, in one line
        with pytest.raises(TileMismatch, match=r"fixes height and width.*--tile") as err:
            runner(_input(net, (tile[0], tile[1] + io.input_multiple[1], tile[2]), seed=6))
        assert "\n" not in str(err.value)


def test_shape_generic_graph_accepts_multiples_and_refuses_the_rest(tmp_path, capsys):
    """The conv baseline traces with no size-dependent branch: H and W are dynamic; T is fixed."""
    opt, net = _experiment(tmp_path, "base", TINY_NETS["videoconvbaseline"])
    out = str(tmp_path / "base.onnx")
    assert export.main(["--opt", opt, "--tile", "3", "16", "16", "--out", out]) == 0
    assert "height and width are dynamic" in capsys.readouterr().out
    runner = OnnxNetwork(out)
    assert runner.tile.dynamic_hw and runner.tile.frames == 3
    assert _diff(runner, net, _input(net, (3, 9, 31), seed=1)) <= FP32_TOL
    with pytest.raises(TileMismatch, match=r"exported for tiles of 3 x 16 x 16.*4 frames.*--tile 4 9 31"):
        runner(_input(net, (4, 9, 31), seed=1))
    with pytest.raises(TileMismatch, match="reads 3 input channels, got 4"):
        runner(torch.zeros(1, 3, 4, 16, 24))


def test_fp16_graph_takes_float32_and_states_its_difference(tmp_path, capsys):
    opt, net = _experiment(tmp_path, "half", TINY_NETS["videoconvbaseline"])
    out = str(tmp_path / "half.onnx")
    assert export.main(["--opt", opt, "--tile", "2", "16", "16", "--dtype", "fp16", "--out", out]) == 0
    printed = capsys.readouterr().out
    stated = float(printed.split("input (fp16): ")[1].split()[0])
    assert 0 < stated <= 5e-2  # fp16 rounding shows, within the stated bound
    runner = OnnxNetwork(out)
    assert runner.metadata["dtype"] == "fp16"
    assert _diff(runner, net, _input(net, (2, 16, 16), seed=3)) <= 5e-2


def test_dynamo_exporter_gives_a_fixed_size_graph(tmp_path, capsys):
    opt, net = _experiment(tmp_path, "dyn", TINY_NETS["videoconvbaseline"])
    out = str(tmp_path / "dyn.onnx")
    assert export.main(["--opt", opt, "--tile", "2", "16", "16", "--exporter", "dynamo", "--out", out]) == 0
    assert "torch.export (dynamo=True): height and width are fixed at 16 x 16" in capsys.readouterr().out
    runner = OnnxNetwork(out)
    assert not runner.tile.dynamic_hw and _diff(runner, net, _input(net, (2, 16, 16), seed=2)) <= FP32_TOL
    with pytest.raises(TileMismatch, match="this tile is 16 x 24"):
        runner(_input(net, (2, 16, 24), seed=2))


def test_bad_requests_are_one_line_and_write_nothing(tmp_path, caplog, monkeypatch):
    opt, _ = _experiment(tmp_path, "vrt", TINY_NETS["vrt"])
    out = tmp_path / "x.onnx"
    assert export.main(["--opt", opt, "--tile", "2", "36", "36", "--out", str(out)]) == 1
    assert "multiples of 8 x 8" in caplog.text and not out.exists()
    caplog.clear()
    assert export.main(["--opt", opt, "--tile", "2", "24", "24", "--out", str(out)]) == 1  # VRT's own check
    assert "VRT cannot compute an input" in caplog.text and not out.exists()
    caplog.clear()  # main_test_vrt.py's --tile H is both height and width: a non-square fixed graph would never run
    assert export.main(["--opt", opt, "--tile", "2", "40", "48", "--out", str(out)]) == 1
    (line,) = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]  # info lines may come first
    assert "--tile 2 40 48: main_test_vrt.py --onnx runs square tiles" in line and "give H = W" in line
    assert "\n" not in line and not out.exists()
    monkeypatch.setitem(sys.modules, "onnxruntime", None)
    with pytest.raises(ImportError, match="pip install onnxruntime"):
        OnnxNetwork(str(out))
    assert "pip install" in MISSING_ORT


def _not_default(value, k: int):
    """A value of the default's type that differs from it (and from the other fields' values: ``k``)."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 3 + k
    if isinstance(value, tuple):
        return tuple(v + 2 + k + i for i, v in enumerate(value))
    raise AssertionError(f"NetIO field of type {type(value).__name__}: give it a metadata form")


def test_every_netio_field_goes_into_the_metadata_and_back():
    """One serialiser and its inverse: each field of NetIO, at a value other than its default, survives the round
    trip (a new field that as_metadata leaves out, or from_metadata does not read, fails here); a file written
    before a field existed gets its default; the exported tile round-trips too."""
    from dataclasses import fields

    from models.net_io import NetIO
    from models.onnx_runner import ExportedTile, io_from_metadata, tile_from_metadata

    io = NetIO(**{f.name: _not_default(f.default, k) for k, f in enumerate(fields(NetIO))})
    meta = io.as_metadata()
    assert list(meta) == [f.name for f in fields(NetIO)] and all(isinstance(v, str) for v in meta.values())
    assert io_from_metadata(meta) == io
    last = fields(NetIO)[-1].name
    older = {k: v for k, v in meta.items() if k != last}
    assert io_from_metadata(older) == NetIO(**{f.name: getattr(io, f.name) for f in fields(NetIO) if f.name != last})
    tile = ExportedTile(3, 48, 64, True, (8, 16))
    assert tile_from_metadata(tile.as_metadata()) == tile
