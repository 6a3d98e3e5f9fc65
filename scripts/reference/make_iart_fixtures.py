"""Make ``tests/fixtures/iart/`` by running the official IART (outside this repository) on small configurations.

Usage (the checkouts anywhere outside this repository; see ``scripts/reference/iart_official.py``)::

    git clone https://github.com/kai422/IART /tmp/ref_iart/IART
    git clone https://github.com/XPixelGroup/BasicSR /tmp/ref_iart/BasicSR
    python scripts/reference/make_iart_fixtures.py --iart /tmp/ref_iart/IART --basicsr /tmp/ref_iart/BasicSR

It writes (one thread, on the CPU; a few minutes, most of it the float64 run):

* ``state_dict_shapes.json.gz``: ``{config: {'kwargs', 'shapes', 'buffers', 'num_params'}}`` of the official
  network for its constructor defaults and for the released models' constructor (REDS N6/N16, Vimeo-90K BI/BD);
* ``golden_<case>.pt``: the official network's output and gradients on tiny configurations whose weights are a
  pure function of a seed (``tests.support.golden.deterministic_fill``) and whose input is a seeded
  ``torch.rand``: the output every ``step``-th pixel, its mean, mean absolute value and the loss
  ``mean(out ** 2)``, the input's gradient (every ``step``-th pixel) and parameter gradients (each tensor's largest
  magnitude and its entries, every ``stride``-th one for big tensors). Cases: ``second_order`` (5 frames: second-order
  propagation), ``mirror`` (a mirror-extended clip), ``cache`` (``cpu_cache_length`` below the clip: the official's
  cache mode, run on the CPU) in float32, and ``fp64`` (float64 forward).

The network runs in ``eval()`` (stochastic depth off); nothing else differs between train and eval.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
import warnings
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from scripts.reference.iart_official import load_official  # noqa: E402
from tests.support.golden import deterministic_fill  # noqa: E402

RELEASED = {"mid_channels": 64, "embed_dim": 120, "depths": [6, 6, 6], "num_heads": [6, 6, 6],
            "window_size": [3, 8, 8], "num_frames": 3, "cpu_cache_length": 100, "is_low_res_input": True}
# two residual groups, the first with an unshifted and a shifted block (the shift mask), windows that do not divide
# the second_order case's width (the padding)
TINY = {"mid_channels": 8, "embed_dim": 12, "depths": [2, 1], "num_heads": [2, 3], "window_size": [3, 4, 4],
        "use_checkpoint": [False] * 4}
FILL_SEED, FILL_GAIN = 1, 0.5
# case: (input shape (N, T, C, H, W), input seed, mirrored (the input is x followed by x reversed), cpu_cache_length,
# output step, float64, with gradients)
CASES: dict[str, dict[str, Any]] = {
    "second_order": {"shape": (1, 5, 3, 64, 70), "seed": 0, "mirror": False, "cache": 100, "step": 8,
                     "dtype": "float32", "grads": True},
    "mirror": {"shape": (1, 2, 3, 64, 64), "seed": 1, "mirror": True, "cache": 100, "step": 8, "dtype": "float32",
               "grads": True},
    "cache": {"shape": (1, 4, 3, 64, 64), "seed": 2, "mirror": False, "cache": 2, "step": 8, "dtype": "float32",
              "grads": True},
    "fp64": {"shape": (1, 3, 3, 64, 64), "seed": 3, "mirror": False, "cache": 100, "step": 8, "dtype": "float64",
             "grads": False},
}
FULL_GRAD = 256  # parameter gradients up to this many entries are stored whole; bigger ones every stride-th entry


def case_input(case: dict[str, Any]) -> torch.Tensor:
    """The case's input: seeded uniform frames drawn in the case's dtype, mirrored where the case says."""
    x = torch.rand(case["shape"], generator=torch.Generator().manual_seed(case["seed"]),
                   dtype=getattr(torch, case["dtype"]))
    if case["mirror"]:
        x = torch.cat([x, x.flip(1)], dim=1)
    return x


def shape_entry(cls: type, kwargs: dict[str, Any]) -> dict[str, Any]:
    net = cls(**kwargs)
    sd = net.state_dict()
    return {"kwargs": kwargs, "shapes": {k: list(v.shape) for k, v in sd.items()},
            "buffers": sorted(k for k, _ in net.named_buffers() if k in sd),
            "num_params": sum(p.numel() for p in net.parameters())}


def run_case(cls: type, name: str, case: dict[str, Any]) -> dict[str, Any]:
    torch.manual_seed(0)
    net = cls(**TINY, cpu_cache_length=case["cache"])
    deterministic_fill(net, FILL_SEED, gain=FILL_GAIN)
    net = net.to(getattr(torch, case["dtype"])).eval()
    x = case_input(case).requires_grad_(case["grads"])
    with torch.set_grad_enabled(case["grads"]):
        out = net(x)
        loss = out.square().mean()
        if case["grads"]:
            loss.backward()
    s = case["step"]
    record = {"case": name, **{k: v for k, v in case.items()}, "config": TINY, "fill_seed": FILL_SEED,
              "fill_gain": FILL_GAIN, "output_sub": out.detach()[..., ::s, ::s].clone(),
              "output_mean": out.mean().item(), "output_abs_mean": out.abs().mean().item(), "loss": loss.item()}
    if case["grads"]:
        record["input_grad_sub"] = x.grad[..., ::s, ::s].clone()
        record["input_grad_scale"] = x.grad.abs().max().item()
        grads = {}
        for pname, p in net.named_parameters():
            if p.grad is None:
                continue
            flat = p.grad.flatten()
            stride = max(1, flat.numel() // FULL_GRAD)
            grads[pname] = {"stride": stride, "values": flat[::stride].clone(), "scale": flat.abs().max().item()}
        record["grads"] = grads
    return record


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--iart", required=True, help="checkout of github.com/kai422/IART")
    parser.add_argument("--basicsr", required=True, help="checkout of github.com/XPixelGroup/BasicSR")
    parser.add_argument("--out", default=str(REPO / "tests" / "fixtures" / "iart"))
    parser.add_argument("--only", nargs="*", help="cases to make (default: all, and the shape table)")
    args = parser.parse_args(argv)
    warnings.simplefilter("ignore")  # the official code's meshgrid and timm deprecation warnings
    torch.set_num_threads(1)
    cls = load_official(args.iart, args.basicsr).IART
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if not args.only:
        table = {"defaults": shape_entry(cls, {}), "released": shape_entry(cls, RELEASED)}
        with gzip.open(out / "state_dict_shapes.json.gz", "wt") as fh:
            json.dump(table, fh)
        print("wrote state_dict_shapes.json.gz:", {k: v["num_params"] for k, v in table.items()})
    for name, case in CASES.items():
        if args.only and name not in args.only:
            continue
        record = run_case(cls, name, case)
        torch.save(record, out / f"golden_{name}.pt")
        print(f"wrote golden_{name}.pt: output mean {record['output_mean']:.6f}, loss {record['loss']:.8f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
