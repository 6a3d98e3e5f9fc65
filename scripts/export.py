"""Export a network for deployment: an ONNX graph of one tile (default) or its weights as safetensors.

Usage:
    python scripts/export.py --task 001_VRT_videosr_bi_REDS_6frames --tile 40 128 128 --out vrt001.onnx
    python scripts/export.py --opt options/vrt/000_train_vrt_demo.json --tile 2 64 64 --out demo.onnx --dtype fp16
    python scripts/export.py --opt options/vrt/000_train_vrt_demo.json --format safetensors --out demo.safetensors

The network is built and its weights loaded as ``main_test_vrt.py`` builds them (``--task`` with
``--model_path`` defaulting to ``model_zoo/``; ``--opt`` with the newest checkpoint of the experiment; ``--ema``
takes ``{step}_E.pth``). The ONNX graph is the network on one tile, input ``lq`` ``(1, T, C, H, W)`` float32 in
[0, 1] (the noise-level map as the last channel of a non-blind denoiser), output ``out``; tiling stays in Python
(``main_test_vrt.py --onnx``). T is fixed; H and W are dynamic (any multiple of the network's padding multiple) only
when tracing met no Python branch on a tensor's size or value, otherwise they are fixed at the tile and
``models.onnx_runner.OnnxNetwork`` refuses other sizes. What a runner needs (scale, tile, padding multiple, layout,
value range, noise-map channel, frame interpolation, ...) is in the model's metadata. The file is checked with the
ONNX checker and with ONNX Runtime against PyTorch on a random input, and the largest absolute difference is
printed (written to ``--out`` only when it is within ``--tolerance``).

safetensors: the bare state dict of G (or of the EMA with ``--ema``), with the netG options in its metadata;
training (``path.pretrained_netG``), ``main_test_vrt.py --model_path`` and this script read it as a ``.pth``.
"""

from __future__ import annotations

import argparse
import copy
import io
import json
import logging
import os
import sys
import time
import warnings
from collections import Counter
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402
from torch import nn  # noqa: E402

from engine.eval_setup import TestSetup, build_parser, setup_model  # noqa: E402
from engine.options import parse_options  # noqa: E402
from models.model_zoo import TASKS, ModelZooError  # noqa: E402
from models.net_io import InputMismatch, NetIO, unwrap  # noqa: E402
from models.onnx_runner import MISSING_ORT, ExportedTile, OnnxNetwork  # noqa: E402
from utils import utils_checkpoint, utils_fs, utils_safetensors  # noqa: E402
from utils.utils_option import OptionError  # noqa: E402

logger = logging.getLogger("export")

OPSET = 17
TOLERANCE = {"fp32": 1e-4, "fp16": 5e-2}
NOISE_LEVEL = 25 / 255  # the random input's noise-level map (non-blind denoisers)


class _Refused(Exception):
    """The exported graph is not kept (the message says why)."""


class _Half(nn.Module):
    """The network in fp16 with float32 input and output (cast inside the graph), for fp16 engines."""

    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = copy.deepcopy(net).half()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x.half()).float()


def build_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--opt", help="option file of a trained model (its netG; weights: the newest checkpoint)")
    src.add_argument("--task", help=f"a released model: {', '.join(TASKS)}")
    p.add_argument("--model_path", help="weights file (.pth or .safetensors) instead of the default one")
    p.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="override keys of --opt")
    p.add_argument("--ema", action="store_true", help="export the EMA weights ({step}_E.pth, params_ema)")
    p.add_argument("--format", choices=("onnx", "safetensors"), default="onnx")
    p.add_argument("--tile", type=int, nargs=3, metavar=("T", "H", "W"),
                   help="frames, height and width of the tile the graph runs on (default: the model's test tile)")
    p.add_argument("--out", help="output file (default: <name>.onnx or <name>.safetensors)")
    p.add_argument("--dtype", choices=("fp32", "fp16"), default="fp32",
                   help="fp16: the graph computes in fp16 (input and output stay float32); safetensors: fp16 weights")
    p.add_argument("--opset", type=int, default=OPSET, help=f"ONNX opset (default {OPSET})")
    p.add_argument("--exporter", choices=("torchscript", "dynamo"), default="torchscript",
                   help="torch.onnx.export with dynamo=False (default: finds the size-dependent branches, so shape-"
                        "generic networks get dynamic height and width) or dynamo=True (torch.export; the tile's "
                        "height and width are fixed)")
    p.add_argument("--tolerance", type=float, default=None,
                   help="largest accepted |ONNX Runtime - PyTorch| (default 1e-4 for fp32, 5e-2 for fp16)")
    return p.parse_args(argv)


def load_model(args: argparse.Namespace) -> tuple[TestSetup, dict[str, Any]]:
    """The network with its weights, as ``main_test_vrt.py`` builds it, and its ``netG`` options."""
    eval_args = build_parser().parse_args([])
    eval_args.opt, eval_args.set, eval_args.model_path = args.opt, args.set, args.model_path
    eval_args.task = args.task or eval_args.task
    eval_args.tile = [args.tile[0], args.tile[1]] if args.tile else None
    if args.opt:
        opt = parse_options(args.opt, args.set, is_train=False)
        net_g = dict(opt["netG"])
        if args.ema and not args.model_path:
            eval_args.model_path = _newest_ema(opt["path"]["models"])
    else:
        spec = TASKS[args.task]
        net_g = {"net_type": spec.net_type, **spec.net_kwargs()}
    try:
        setup = setup_model(eval_args)
    except InputMismatch:  # a denoiser whose options give no noise level: it only shapes the test set, not the net
        eval_args.sigma = round(NOISE_LEVEL * 255)
        setup = setup_model(eval_args)
    if args.ema:
        utils_checkpoint.load_network(unwrap(setup.net), setup.model_path, param_key="params_ema", strict=True)
    return setup, net_g


def _newest_ema(models_dir: str) -> str:
    steps = [int(n.split("_")[0]) for n in os.listdir(models_dir) if n.endswith("_E.pth") and n[0].isdigit()] \
        if os.path.isdir(models_dir) else []
    if not steps:
        raise utils_checkpoint.CheckpointError(f"--ema: no {{step}}_E.pth in {models_dir} (was EMA on?); pass "
                                               "--model_path")
    return os.path.join(models_dir, f"{max(steps)}_E.pth")


def resolve_tile(args: argparse.Namespace, setup: TestSetup) -> tuple[int, int, int]:
    """``--tile``, else the model's test tile; refuse one the network cannot run as a graph."""
    io_ = setup.io
    if args.tile:
        frames, height, width = args.tile
    else:
        frames, height, width = setup.tile[0], setup.tile[1], setup.tile[1]
    if min(frames, height, width) <= 0:
        raise ValueError(f"--tile T H W: the graph is built for one tile size, give positive values (the model's "
                         f"test tile is {setup.tile[0]} {setup.tile[1]} {setup.tile[1]}, 0 meaning the whole clip)")
    _, mh, mw = io_.input_multiple
    if min(height, width) < io_.min_size:
        raise ValueError(f"--tile {frames} {height} {width}: the network takes frames of at least {io_.min_size} x "
                         f"{io_.min_size} pixels; give a height and width of {io_.min_size} or more")
    if height % mh or width % mw:
        raise ValueError(f"--tile {frames} {height} {width}: tiles reach the network padded to multiples of "
                         f"{mh} x {mw}; give a height and width that are such multiples")
    if height != width:
        raise ValueError(f"--tile {frames} {height} {width}: main_test_vrt.py --onnx runs square tiles (its --tile H "
                         f"sets height and width, as in the official script), so a graph fixed at {height} x {width} "
                         f"could never run there; give H = W (a graph the exporter finds shape-generic then runs any "
                         f"multiple of {mh} x {mw} anyway)")
    return frames, height, width


def random_input(io_: NetIO, tile: tuple[int, int, int], seed: int = 0) -> torch.Tensor:
    """``(1, T, C, H, W)`` uniform in [0, 1]; the noise-level map channel is constant."""
    frames, height, width = tile
    x = torch.rand(1, frames, io_.in_chans, height, width, generator=torch.Generator().manual_seed(seed))
    if io_.noise_map:
        x[:, :, -1] = NOISE_LEVEL
    return x


def trace_to_onnx(net: nn.Module, x: torch.Tensor, opset: int) -> tuple[bytes, list[str]]:
    """Trace ``net`` on ``x`` (TorchScript exporter) with height and width declared dynamic.

    Returns:
        The serialised model and ``file:line`` of every place where the trace turned a traced size or value
        into a Python number or boolean (a branch or constant frozen at this input's shape).
    """
    buffer = io.BytesIO()
    with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.onnx.export(net, (x,), buffer, dynamo=False, opset_version=opset, input_names=["lq"],
                          output_names=["out"], dynamic_axes={"lq": {3: "height", 4: "width"},
                                                              "out": {3: "out_height", 4: "out_width"}})
    frozen = [f"{_where(w.filename)}:{w.lineno}" for w in caught if issubclass(w.category, torch.jit.TracerWarning)]
    # the project's own lines first (torch's are tensors formatted into messages that were never raised)
    return buffer.getvalue(), sorted(frozen, key=_outside_repo)


def _where(filename: str) -> str:
    """A source file relative to the repository root (whatever the working directory), else its absolute path."""
    path = Path(filename).resolve()
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)


def _outside_repo(location: str) -> bool:
    return os.path.isabs(location)


def dynamo_to_onnx(net: nn.Module, x: torch.Tensor, opset: int) -> bytes:
    """Export ``net`` on ``x`` with ``torch.export`` (``dynamo=True``), every dimension fixed."""
    with torch.no_grad():
        program = torch.onnx.export(net, (x,), dynamo=True, opset_version=max(opset, 18), input_names=["lq"],
                                    output_names=["out"], verbose=False)
    return program.model_proto.SerializeToString()


def _fix_hw(model: Any, tile: tuple[int, int, int]) -> None:
    """Make the graph's input height and width the tile's (ONNX Runtime then refuses any other)."""
    dims = model.graph.input[0].type.tensor_type.shape.dim
    for dim, value in zip(dims[3:], tile[1:]):
        dim.Clear()
        dim.dim_value = value


def _normalize_transposes(model: Any) -> int:
    """Turn negative axes in ``Transpose`` permutations into positive ones (the TorchScript exporter writes
    ``movedim(2, -1)`` of a tensor of unknown rank as ``perm=[0, 1, 3, 4, -1]``, which ONNX Runtime refuses; a
    permutation's length is the rank). Returns how many nodes changed."""
    changed = 0
    for node in model.graph.node:
        if node.op_type != "Transpose":
            continue
        for attr in node.attribute:
            if attr.name == "perm" and any(p < 0 for p in attr.ints):
                rank = len(attr.ints)
                fixed = [p % rank for p in attr.ints]
                del attr.ints[:]
                attr.ints.extend(fixed)
                changed += 1
    return changed


def metadata(setup: TestSetup, net_g: dict[str, Any], tile: tuple[int, int, int], dynamic: bool,
             args: argparse.Namespace) -> dict[str, str]:
    """What a runner needs, as the model's string metadata."""
    io_ = setup.io
    _, mh, mw = io_.input_multiple
    return {**io_.as_metadata(), **ExportedTile(*tile, dynamic, (mh, mw)).as_metadata(),
            "window": ",".join(map(str, io_.input_multiple)),
            "tile_overlap": ",".join(map(str, setup.tile_overlap)), "layout": "NTCHW", "value_range": "0,1",
            "sigma_channel": str(io_.in_chans - 1) if io_.noise_map else "none", "dtype": args.dtype,
            "task": setup.name, "net_type": str(net_g.get("net_type", "")), "netG": json.dumps(net_g),
            "weights": os.path.basename(setup.model_path), "ema": str(int(args.ema)),
            "exporter": f"torch {torch.__version__} torch.onnx ({args.exporter})"}


def ort_difference(path: str, net: nn.Module, x: torch.Tensor, expected: torch.Tensor | None = None) -> float:
    """Largest ``|ONNX Runtime - PyTorch|`` of the exported file on ``x`` (CPU provider)."""
    runner = OnnxNetwork(path, providers=["CPUExecutionProvider"])
    with torch.no_grad():
        want = net(x) if expected is None else expected
    return float((runner(x) - want.float()).abs().max())


def export_onnx(args: argparse.Namespace, setup: TestSetup, net_g: dict[str, Any], out: str) -> int:
    try:
        import onnx
        import onnxruntime  # noqa: F401
    except ImportError:
        logger.error("%s", MISSING_ORT)
        return 1
    net = unwrap(setup.net).float().eval().cpu()
    tile = resolve_tile(args, setup)
    x = random_input(setup.io, tile)
    with torch.no_grad():
        expected = net(x)
    traced: nn.Module = _Half(net) if args.dtype == "fp16" else net
    start = time.perf_counter()
    if args.exporter == "dynamo":
        model = onnx.load_from_string(dynamo_to_onnx(traced, x, args.opset))
        dynamic = False
        print(f"torch.export (dynamo=True): height and width are fixed at {tile[1]} x {tile[2]}")
    else:
        data, frozen = trace_to_onnx(traced, x, args.opset)
        model = onnx.load_from_string(data)
        dynamic = not frozen
        if frozen:
            counts = Counter(frozen)
            where = ", ".join(f"{loc} (x{counts[loc]})" for loc in sorted(
                counts, key=lambda k: (_outside_repo(k), -counts[k]))[:6])
            more = ", ..." if len(counts) > 6 else ""
            print(f"{len(frozen)} Python branches or constants frozen at the traced size ({where}{more}): height "
                  f"and width are fixed at {tile[1]} x {tile[2]}")
        else:
            print(f"no size-dependent Python branch met: height and width are dynamic (multiples of "
                  f"{setup.io.input_multiple[1]} x {setup.io.input_multiple[2]})")
    _normalize_transposes(model)
    if not dynamic:
        _fix_hw(model, tile)
    for key, value in metadata(setup, net_g, tile, dynamic, args).items():
        model.metadata_props.add(key=key, value=value)
    try:
        with utils_fs.atomic_path(out, suffix=".onnx") as tmp:  # the checker and the runner read the extension
            onnx.save(model, tmp)
            onnx.checker.check_model(tmp)
            print(f"exported in {time.perf_counter() - start:.1f} s; ONNX checker: ok")
            tolerance = TOLERANCE[args.dtype] if args.tolerance is None else args.tolerance
            diff = ort_difference(tmp, net, x, expected)
            print(f"max |ONNX Runtime - PyTorch| on a random {tuple(x.shape)} input ({args.dtype}): {diff:.3g}")
            worst = diff
            if dynamic:
                mh, mw = setup.io.input_multiple[1:]
                other = (tile[0], tile[1] + mh, tile[2] + 2 * mw)
                diff2 = ort_difference(tmp, net, random_input(setup.io, other, seed=1))
                print(f"max |ONNX Runtime - PyTorch| at another size {other[1]} x {other[2]}: {diff2:.3g}")
                worst = max(worst, diff2)
            if not worst <= tolerance:
                raise _Refused(f"the exported graph differs from PyTorch by {worst:.3g} (> --tolerance "
                               f"{tolerance:g}); nothing written")
    except _Refused as exc:
        logger.error("%s", exc)
        return 1
    print(f"wrote {out}")
    return 0


def export_safetensors(args: argparse.Namespace, setup: TestSetup, net_g: dict[str, Any], out: str) -> int:
    state = unwrap(setup.net).state_dict()
    if args.dtype == "fp16":
        state = {k: v.half() if v.is_floating_point() else v for k, v in state.items()}
    meta = {"format": "pt", "param_key": "params_ema" if args.ema else "params", "netG": net_g,
            "task": setup.name, "weights": os.path.basename(setup.model_path), "dtype": args.dtype}
    utils_safetensors.write_state_dict(state, out, meta)
    print(f"wrote {out} ({len(state)} tensors, {os.path.getsize(out) / 2**20:.1f} MiB)")
    return 0


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    args = build_args(argv)
    try:
        setup, net_g = load_model(args)
        out = args.out or f"{setup.name}.{args.format}"
        if args.format == "safetensors":
            return export_safetensors(args, setup, net_g, out)
        return export_onnx(args, setup, net_g, out)
    except (ModelZooError, FileNotFoundError, OptionError, ValueError, utils_checkpoint.CheckpointError) as exc:
        logger.error("error: %s", str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
        return 1


if __name__ == "__main__":
    sys.exit(main())
