"""Regenerate tests/fixtures/basicvsrpp/ (``golden_<case>.pt``, ``state_dict_shapes.json.gz``) by running BasicSR's
BasicVSR++ (``basicsr/archs/basicvsrpp_arch.py``) from a checkout outside this project. Not part of the suite.

    git clone https://github.com/XPixelGroup/BasicSR /tmp/ref_basicsr      # made with commit 8d56e3a
    python scripts/reference/make_basicvsrpp_fixtures.py --basicsr /tmp/ref_basicsr --check   # compare only
    python scripts/reference/make_basicvsrpp_fixtures.py --basicsr /tmp/ref_basicsr           # rewrite the files

BasicSR's architecture files are imported from the checkout as they are, without its package ``__init__`` (which
needs its compiled ops and its data stack): this script puts small stand-ins for ``basicsr.utils`` (a logger and a
registry whose ``register`` keeps the class) and ``basicsr.ops.dcn`` in ``sys.modules``. The stand-in
``ModulatedDeformConvPack`` holds the parameters BasicSR's has (``weight``, ``bias``; the alignment module replaces
``conv_offset``) and is never run: BasicVSR++'s alignment calls ``torchvision.ops.deform_conv2d`` itself. Two
changes to the reference, neither in the computation: its constructor builds the alignment modules only when CUDA is
available (``torch.cuda.is_available`` reads True while it runs), and its assert that SpyNet's frames have 64+ pixels
is taken out of ``forward`` (the 'deblur' and 'mirror_small' cases run smaller ones).

Each golden case fills the reference with ``tests.support.golden.deterministic_fill`` (by parameter name, so ours gets
the same weights), runs a seeded input at one thread, and records every ``step``-th output pixel, the output's mean
and mean magnitude, the loss ``mean(out ** 2)`` and the gradients of a few parameters (tests/test_network_basicvsrpp.py
reads them). ``--check`` reports the largest difference from the files in the repository (0 when the run reproduces
them bit for bit).
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import gzip
import importlib
import json
import logging
import os
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.support.golden import deterministic_fill  # noqa: E402

FIXTURES = ROOT / "tests" / "fixtures" / "basicvsrpp"
CASES: dict[str, dict[str, Any]] = {
    "sr": {"config": {"mid_channels": 16, "num_blocks": 2}, "input_shape": [1, 3, 3, 64, 64], "mirror": False},
    "deblur": {"config": {"mid_channels": 16, "num_blocks": 2, "is_low_res_input": False},
               "input_shape": [1, 3, 3, 160, 176], "mirror": False},
    "mirror_small": {"config": {"mid_channels": 8, "num_blocks": 1, "max_residue_magnitude": 5},
                     "input_shape": [1, 2, 3, 40, 48], "mirror": True},
}
FILL_SEED, INPUT_SEED, STEP = 7, 11, 4
GRADS = ["conv_last.weight", "conv_hr.bias", "upconv2.bias", "deform_align.backward_1.weight",
         "deform_align.forward_2.conv_offset.6.bias", "deform_align.backward_2.conv_offset.0.weight",
         "backbone.forward_1.main.0.weight", "reconstruction.main.0.bias",
         "spynet.basic_module.5.basic_module.8.weight"]
SHAPE_CONFIGS = {
    "defaults": {},
    "reds4_vimeo_c64n7": {"mid_channels": 64, "num_blocks": 7, "is_low_res_input": True},
    "deblur_c64n15": {"mid_channels": 64, "num_blocks": 15, "is_low_res_input": False},
    "ntire_vsr_c128n25": {"mid_channels": 128, "num_blocks": 25, "is_low_res_input": True},
    "ntire_decompress_c128n25": {"mid_channels": 128, "num_blocks": 25, "is_low_res_input": False},
}


class _Registry:
    """``ARCH_REGISTRY.register()`` of the stand-in ``basicsr.utils.registry``: keeps the class as it is."""

    def register(self, obj: Any = None) -> Any:
        return obj if obj is not None else (lambda cls: cls)


class _ModulatedDeformConvPack(nn.Module):
    """Stand-in for ``basicsr.ops.dcn.ModulatedDeformConvPack``: its attributes and parameters, no forward."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, stride: int = 1, padding: int = 0,
                 dilation: int = 1, groups: int = 1, deformable_groups: int = 1, bias: bool = True) -> None:
        super().__init__()
        self.in_channels, self.out_channels = in_channels, out_channels
        self.kernel_size = (kernel_size, kernel_size)
        self.stride, self.padding, self.dilation = stride, padding, dilation
        self.groups, self.deformable_groups = groups, deformable_groups
        self.weight = nn.Parameter(torch.zeros(out_channels, in_channels // groups, kernel_size, kernel_size))
        self.bias = nn.Parameter(torch.zeros(out_channels)) if bias else None


def _package(name: str, path: list[str] | None = None, **attrs: Any) -> types.ModuleType:
    module = types.ModuleType(name)
    if path is not None:
        module.__path__ = path
    module.__dict__.update(attrs)
    sys.modules[name] = module
    return module


def _without_spynet_size_assert(source: str) -> str:
    """The module's source less the assert on the low-res frame size inside ``BasicVSRPlusPlus.forward``."""
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name == "forward":
            node.body = [s for s in node.body if not (isinstance(s, ast.Assert) and "64" in ast.unparse(s.test))]
    return ast.unparse(tree)


def load_reference(basicsr: Path) -> type[nn.Module]:
    """BasicSR's ``BasicVSRPlusPlus`` class, imported from the checkout at ``basicsr``."""
    archs = basicsr / "basicsr" / "archs"
    if not (archs / "basicvsrpp_arch.py").is_file():
        raise SystemExit(f"{archs / 'basicvsrpp_arch.py'} not found: pass --basicsr <a BasicSR checkout>")
    _package("basicsr", [str(basicsr / "basicsr")])
    _package("basicsr.archs", [str(archs)])
    _package("basicsr.utils", [], get_root_logger=lambda *a, **k: logging.getLogger("basicsr"))
    _package("basicsr.utils.registry", ARCH_REGISTRY=_Registry())
    _package("basicsr.ops", [])

    def unavailable(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("BasicSR's compiled modulated_deform_conv is not used by BasicVSR++")

    _package("basicsr.ops.dcn", ModulatedDeformConvPack=_ModulatedDeformConvPack, modulated_deform_conv=unavailable)
    name = "basicsr.archs.basicvsrpp_arch"
    module = types.ModuleType(name)
    module.__file__ = str(archs / "basicvsrpp_arch.py")
    module.__package__ = "basicsr.archs"
    sys.modules[name] = module
    importlib.import_module("basicsr.archs.arch_util")
    source = _without_spynet_size_assert((archs / "basicvsrpp_arch.py").read_text())
    exec(compile(source, module.__file__, "exec"), module.__dict__)  # noqa: S102 (the reference, run as a module)
    return module.BasicVSRPlusPlus


@contextlib.contextmanager
def _cuda_reported_available() -> Iterator[None]:
    real = torch.cuda.is_available
    torch.cuda.is_available = lambda: True  # the constructor's guard; nothing is moved to a GPU
    try:
        yield
    finally:
        torch.cuda.is_available = real


def golden(ref_cls: type[nn.Module], case: dict[str, Any]) -> dict[str, Any]:
    """One ``golden_<case>.pt`` dict."""
    with _cuda_reported_available():
        net = ref_cls(**case["config"])
    deterministic_fill(net, FILL_SEED)
    x = torch.rand(case["input_shape"], generator=torch.Generator().manual_seed(INPUT_SEED))
    if case["mirror"]:
        x = torch.cat([x, x.flip(1)], dim=1)
    out = net(x)
    loss = out.square().mean()
    loss.backward()
    params = dict(net.named_parameters())
    return {"config": case["config"], "fill_seed": FILL_SEED, "input_shape": case["input_shape"],
            "input_seed": INPUT_SEED, "mirror": case["mirror"], "step": STEP,
            "output_sub": out.detach()[..., ::STEP, ::STEP].clone(), "output_mean": out.mean().item(),
            "output_abs_mean": out.abs().mean().item(), "loss": loss.item(),
            "grads": {name: params[name].grad.clone() for name in GRADS}}


def shapes(ref_cls: type[nn.Module]) -> dict[str, Any]:
    """The ``state_dict_shapes.json.gz`` table: keys and shapes, persistent buffers, parameter counts."""
    table = {}
    for name, kwargs in SHAPE_CONFIGS.items():
        with _cuda_reported_available(), torch.device("meta"):
            net = ref_cls(**kwargs)
        sd = net.state_dict()
        table[name] = {"kwargs": kwargs, "shapes": {k: list(v.shape) for k, v in sd.items()},
                       "buffers": sorted(k for k, _ in net.named_buffers() if k in sd),
                       "num_params": sum(p.numel() for p in net.parameters())}
    return table


def _difference(new: Any, old: Any) -> float:
    """The largest absolute difference between two fixture values (inf when their structure differs)."""
    if isinstance(new, torch.Tensor):
        same = isinstance(old, torch.Tensor) and new.shape == old.shape
        return float((new - old).abs().max()) if same and new.numel() else (0.0 if same else float("inf"))
    if isinstance(new, dict):
        if not isinstance(old, dict) or new.keys() != old.keys():
            return float("inf")
        return max((_difference(new[k], old[k]) for k in new), default=0.0)
    if isinstance(new, float):
        return abs(new - old) if isinstance(old, float) else float("inf")
    return 0.0 if new == old else float("inf")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--basicsr", type=Path, required=True, help="a BasicSR checkout (the folder holding basicsr/)")
    parser.add_argument("--out", type=Path, default=FIXTURES, help="where the fixtures are written")
    parser.add_argument("--check", action="store_true", help="compare with the files in --out, write nothing")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)  # the golden outputs were recorded at one thread
    ref_cls = load_reference(args.basicsr.resolve())
    worst = 0.0
    for case, spec in CASES.items():
        data = golden(ref_cls, spec)
        path = args.out / f"golden_{case}.pt"
        if args.check:
            diff = _difference(data, torch.load(path, weights_only=True))
            worst = max(worst, diff)
            print(f"{path.name}: largest difference from the file {diff:.3g}")
        else:
            torch.save(data, path)
            print(f"wrote {path}")
    table = shapes(ref_cls)
    path = args.out / "state_dict_shapes.json.gz"
    if args.check:
        with gzip.open(path, "rt") as fh:
            same = json.load(fh) == table
        worst = max(worst, 0.0 if same else float("inf"))
        print(f"{path.name}: {'the same' if same else 'DIFFERENT'}")
    else:
        with open(path, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as fh:
            fh.write(json.dumps(table).encode())
        print(f"wrote {path}")
    if args.check:
        print("reproduced bit for bit" if worst == 0 else f"largest difference {worst:.3g}")
    return 0 if not args.check or worst == 0 else 1


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.exit(main())
