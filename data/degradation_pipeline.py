"""On-the-fly degradation of training clips: the operation registry, the option format, the presets, and
:func:`build_degradation`, which turns an option value into a callable ``Degradation(gt, rng) -> lq``.

The option ``degradations`` of a training dataset (:data:`DEGRADATION_OPTIONS`) is one of:

- a preset name: ``"bi"``, ``"bd"``, ``"realesrgan"``, ``"realbasicvsr"`` (alias ``"second_order"``);
- a preset with changes: ``{"preset": "realbasicvsr", "codec1": {"codec": ["libx265"], "crf": [24, 32],
  "bitrate": null}, "jpeg2": null}``: each other key names an operation of the preset, whose keys are updated
  (``null`` removes the operation; new ``kernel`` / ``mode`` / ``codec`` choices without their ``*_prob`` get
  equal weights);
- a list of operations, run in order: ``[{"type": "blur", "sigma": [0.2, 3]}, {"type": "noise", "sigma": [1, 20]},
  {"type": "codec", "codec": ["libx264"], "crf": [20, 32]}]``.

An operation is an object with ``type`` (a key of :data:`OPERATIONS`), an optional ``name`` (default: the type
and its count, ``blur1``, ``blur2``, ...), ``prob`` (the chance it runs on a clip) and the keys of its type
(``PARAMS`` of its class, e.g. :class:`data.degradation_ops.Blur`). Ranges are ``[low, high]`` (or one number).
Every random choice of a clip comes from the generator passed in, once per clip (``vary`` lets a parameter drift
linearly over the frames), so a clip's LQ is a function of the GT and the generator's state. After the operations
the clip is resized to exactly GT / scale if it is not that size yet (``area`` when shrinking, else ``bicubic``)
and clipped to [0, 1]. The GT array is never written to. A CPU torch tensor GT (same layout and dtypes) gives a tensor
LQ with the same values.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from data.degradation_ops import KERNELS, OPERATIONS, Clip, Context, DegradationError, Operation
from data.degradations import RESIZE_MODES, resize_clip, to_float32
from utils.utils_option import OptionError, resolve_section
from utils.utils_option_schema import Opt

__all__ = ["DEGRADATION_OPTIONS", "OPERATIONS", "PRESETS", "Degradation", "DegradationError", "build_degradation",
           "check_degradations"]

# ------------------------------------------------------------------------------------------------------- presets
_KERNELS = list(KERNELS)
# Real-ESRGAN's kernel mix (0.45, 0.25, 0.12, 0.03, 0.12, 0.03), of which sinc takes 10 %
_KERNEL_PROB = [0.405, 0.225, 0.108, 0.027, 0.108, 0.027, 0.1]
_MODES = list(RESIZE_MODES)


def _blur(name: str, sigma: list[float], prob: float = 1.0, vary: float = 0.0) -> dict[str, Any]:
    return {"name": name, "type": "blur", "prob": prob, "kernel": _KERNELS, "kernel_prob": _KERNEL_PROB,
            "kernel_size": [7, 21], "sigma": sigma, "beta_gaussian": [0.5, 4], "beta_plateau": [1, 2], "vary": vary}


def _noise(name: str, sigma: list[float], poisson: list[float], vary: float = 0.0) -> dict[str, Any]:
    return {"name": name, "type": "noise", "gaussian_prob": 0.5, "sigma": sigma, "poisson_scale": poisson,
            "gray_prob": 0.4, "vary": vary}


def _sinc(name: str) -> dict[str, Any]:
    return {"name": name, "type": "blur", "prob": 0.8, "kernel": ["sinc"], "kernel_size": [7, 21],
            "omega": [math.pi / 3, math.pi]}


def _codec(name: str) -> dict[str, Any]:
    # RealBasicVSR: libx264, 'h264' (also libx264 in PyAV) and mpeg4, 1e4..1e5 bit/s at 1 frame/s
    return {"name": name, "type": "codec", "codec": ["libx264", "mpeg4"], "codec_prob": [2 / 3, 1 / 3],
            "bitrate": [1e4, 1e5], "fps": 1}


PRESETS: dict[str, list[dict[str, Any]]] = {
    # the benchmarks' degradations, as generate_lq.py writes them (8-bit levels)
    "bi": [{"name": "bi", "type": "bi"}, {"name": "quantize", "type": "quantize"}],
    "bd": [{"name": "bd", "type": "bd", "sigma": 1.6}, {"name": "quantize", "type": "quantize"}],
    # Real-ESRGAN's second-order model (train_realesrgan_x4plus), drawn once per clip
    "realesrgan": [
        _blur("blur1", [0.2, 3]),
        {"name": "resize1", "type": "resize", "direction_prob": [0.2, 0.7, 0.1], "scale": [0.15, 1.5]},
        _noise("noise1", [1, 30], [0.05, 3]),
        {"name": "jpeg1", "type": "jpeg", "quality": [30, 95]},
        _blur("blur2", [0.2, 1.5], prob=0.8),
        {"name": "resize2", "type": "resize", "direction_prob": [0.3, 0.4, 0.3], "scale": [0.3, 1.2],
         "relative_to": "target"},
        _noise("noise2", [1, 25], [0.05, 2.5]),
        {"name": "final", "type": "shuffle", "groups": [
            [{"name": "resize3", "type": "resize", "to": "target", "mode": _MODES}, _sinc("sinc")],
            [{"name": "jpeg2", "type": "jpeg", "quality": [30, 95]}]]},
        {"name": "quantize", "type": "quantize"},
    ],
    # RealBasicVSR (mmagic realbasicvsr_c64b20-1x30x8): the same kinds per clip plus video compression; mmagic's
    # per-frame random walks of the blur, noise and JPEG parameters become a linear drift (vary)
    "realbasicvsr": [
        _blur("blur1", [0.2, 3], vary=0.1),
        {"name": "resize1", "type": "resize", "direction_prob": [0.2, 0.7, 0.1], "scale": [0.15, 1.5]},
        _noise("noise1", [1, 30], [0.05, 3], vary=0.1),
        {"name": "jpeg1", "type": "jpeg", "quality": [30, 95], "vary": 0.1},
        _codec("codec1"),
        _blur("blur2", [0.2, 1.5], prob=0.8, vary=0.1),
        {"name": "resize2", "type": "resize", "direction_prob": [0.3, 0.4, 0.3], "scale": [0.3, 1.2]},
        _noise("noise2", [1, 25], [0.05, 2.5], vary=0.1),
        {"name": "jpeg2", "type": "jpeg", "quality": [30, 95], "vary": 0.1},
        {"name": "final", "type": "shuffle", "groups": [
            [_codec("codec2")],
            [{"name": "resize3", "type": "resize", "to": "target", "mode": _MODES}, _sinc("sinc")]]},
        {"name": "quantize", "type": "quantize"},
    ],
}
PRESET_ALIASES = {"second_order": "realbasicvsr"}
_WEIGHTS_OF = {"kernel": "kernel_prob", "mode": "mode_prob", "codec": "codec_prob"}


# ---------------------------------------------------------------------------------------------------- the spec
def _walk(ops: list[Any]) -> Iterator[dict[str, Any]]:
    """Every operation dict of a list, those inside ``shuffle`` groups included (depth first)."""
    for op in ops:
        if isinstance(op, dict):
            yield op
            if op.get("type") == "shuffle" and isinstance(op.get("groups"), list):
                for group in op["groups"]:
                    if isinstance(group, list):
                        yield from _walk(group)


def _remove(ops: list[Any], name: str) -> list[Any]:
    out = []
    for op in ops:
        if isinstance(op, dict) and op.get("name") == name:
            continue
        if isinstance(op, dict) and op.get("type") == "shuffle":
            op = {**op, "groups": [_remove(group, name) for group in (op["groups"] if "groups" in op else [])]}
        out.append(op)
    return out


def _preset(name: str) -> list[dict[str, Any]]:
    key = PRESET_ALIASES.get(name, name)
    if key not in PRESETS:
        known = ", ".join([*PRESETS, *PRESET_ALIASES])
        raise DegradationError(f"degradations: unknown preset {name!r}; presets: {known} (or a list of operations)")
    return copy.deepcopy(PRESETS[key])


def _expand(spec: Any) -> tuple[str, list[Any]]:
    """``(label, operation dicts)`` of an option value (a preset name, a preset with changes, or a list)."""
    if isinstance(spec, str):
        return spec, _preset(spec)
    if isinstance(spec, list):
        return "custom", copy.deepcopy(spec)
    if not isinstance(spec, dict):
        raise DegradationError(f"degradations must be a preset name, an object with 'preset', or a list of "
                               f"operations, got {type(spec).__name__}")
    if not isinstance(spec.get("preset"), str):
        raise DegradationError("degradations: an object needs 'preset' (a preset name) and operation changes "
                               f"keyed by operation name, got keys {sorted(spec)}")
    ops = _preset(spec["preset"])
    names = [op["name"] for op in _walk(ops)]
    for name, change in spec.items():
        if name == "preset":
            continue
        if name not in names:
            raise DegradationError(f"degradations: preset {spec['preset']!r} has no operation {name!r}; its "
                                   f"operations: {', '.join(names)}")
        if change is None:
            ops = _remove(ops, name)
        elif isinstance(change, dict):
            if "type" in change or "name" in change:
                raise DegradationError(f"degradations.{name}: 'type' and 'name' of a preset operation cannot change")
            for op in _walk(ops):
                if op["name"] == name:
                    op.update(copy.deepcopy(change))
                    for key, weights in _WEIGHTS_OF.items():  # new choices without weights: equal weights
                        if key in change and weights not in change:
                            op.pop(weights, None)
        else:
            raise DegradationError(f"degradations.{name} must be an object of keys to change, or null to remove "
                                   f"the operation, got {change!r}")
    return spec["preset"], ops


def _build_ops(items: list[Any], counts: dict[str, int], names: set[str], where: str) -> list[Operation]:
    ops: list[Operation] = []
    for i, item in enumerate(items):
        at = f"{where}[{i}]"
        if not isinstance(item, dict):
            raise DegradationError(f"{at} must be an object with a 'type', got {item!r}")
        kind = item.get("type")
        if not isinstance(kind, str) or kind not in OPERATIONS:
            raise DegradationError(f"{at}: unknown operation type {kind!r}; types: {', '.join(OPERATIONS)}")
        counts[kind] = counts.get(kind, 0) + 1
        name = item["name"] if "name" in item else f"{kind}{counts[kind]}"  # operations are named by type and count
        if not isinstance(name, str) or name in names:
            raise DegradationError(f"{at}: operation name {name!r} is not a string or is used twice")
        names.add(name)
        cls = OPERATIONS[kind]
        params = {k: v for k, v in item.items() if k not in ("type", "name")}
        try:
            resolved = resolve_section(params, cls.PARAMS, where=f"degradations.{name}")
        except OptionError as exc:
            raise DegradationError(str(exc)) from None
        children = None
        if kind == "shuffle":
            children = [_build_ops(group, counts, names, f"degradations.{name}.groups[{g}]")
                        for g, group in enumerate(resolved["groups"])]
        ops.append(cls(name, resolved, children))
    return ops


def _parse(spec: Any) -> tuple[str, list[Operation]]:
    label, items = _expand(spec)
    return label, _build_ops(items, {}, set(), "degradations")


def check_degradations(spec: Any) -> str | None:
    """Why ``spec`` is not a valid ``degradations`` value (one line naming the operation and key), or ``None``."""
    try:
        _parse(spec)
    except DegradationError as exc:
        return str(exc)
    return None


DEGRADATION_OPTIONS: dict[str, Opt] = {
    "degradations": Opt((str, dict, list, type(None)), None, "How LQ clips are made from GT clips on the fly (once "
                        "per clip, from the item's seeded generator): a preset (`bi`, `bd`, `realesrgan`, "
                        "`realbasicvsr` = `second_order`), `{\"preset\": ..., \"<operation name>\": {changes} or "
                        "null}`, or a list of operations `{\"type\": \"blur\"|\"resize\"|\"noise\"|\"jpeg\"|"
                        "\"codec\"|\"bi\"|\"bd\"|\"quantize\"|\"shuffle\", \"prob\": ..., ...}` "
                        "(docs/datasets.md#degradations-on-the-fly); null: none (the dataset's own LQ).",
                        refuse=lambda v: None if v is None else check_degradations(v)),
}


# -------------------------------------------------------------------------------------------------- the callable
class Degradation:
    """A parsed ``degradations`` option for one scale: ``Degradation(gt, rng) -> lq``.

    Args:
        label: the preset name, or ``custom``.
        ops: the operations, in order.
        scale: GT size / LQ size.
    """

    def __init__(self, label: str, ops: list[Operation], scale: int) -> None:
        self.label = label
        self.ops = ops
        self.scale = scale

    def __call__(self, gt: np.ndarray | torch.Tensor, rng: np.random.Generator) -> np.ndarray | torch.Tensor:
        """Degrade one clip.

        Args:
            gt: ``(T, H, W, 3)`` RGB, uint8 levels or float32 in [0, 1], a numpy array or a CPU torch tensor (the
                same layout); not modified.
            rng: the clip's generator; every random choice is drawn from it, in a fixed order.

        Returns:
            float32 ``(T, H // scale, W // scale, 3)`` in [0, 1], a new array, or a new CPU tensor for a tensor
            input (the same values as for the array of the same numbers).
        """
        if isinstance(gt, torch.Tensor):
            if gt.device.type != "cpu" or gt.requires_grad:
                raise ValueError(f"degradation: a tensor GT clip must be a CPU tensor without grad (loader workers "
                                 f"degrade), got one on {gt.device} (requires_grad={gt.requires_grad})")
            return torch.from_numpy(self(gt.numpy(), rng))
        if not isinstance(gt, np.ndarray) or gt.ndim != 4 or gt.shape[3] != 3 or gt.dtype not in (np.uint8,
                                                                                                    np.float32):
            what = f"{gt.dtype} {gt.shape}" if isinstance(gt, np.ndarray) else type(gt).__name__
            raise ValueError(f"degradation: the GT clip must be a (T, H, W, 3) uint8 or float32 array or CPU tensor, "
                             f"got {what}")
        target = (gt.shape[1] // self.scale, gt.shape[2] // self.scale)
        if min(target) < 1 or gt.shape[0] < 1:
            raise ValueError(f"degradation: a {gt.shape[2]}x{gt.shape[1]} GT clip of {gt.shape[0]} frames has no "
                             f"x{self.scale} LQ")
        clip: Clip = run_ops(self.ops, gt, rng, Context(target=target, scale=self.scale))
        if clip.shape[1:3] != target:
            shrink = clip.shape[1] * clip.shape[2] > target[0] * target[1]
            clip = resize_clip(clip, target, "area" if shrink else "bicubic")
        out = to_float32(clip)  # a new array, also when no operation ran
        return np.clip(out, 0, 1, out=out)

    def describe(self) -> str:
        """One line for the start-up log: the preset and each operation with its ranges."""
        steps = " -> ".join(op.describe() for op in self.ops) or "none"
        return f"degradations '{self.label}' x{self.scale}: {steps} -> GT/{self.scale}"


def run_ops(ops: list[Operation], clip: Clip, rng: np.random.Generator, ctx: Context) -> Clip:
    """Run operations in order; each with ``prob < 1`` first draws whether it runs."""
    for op in ops:
        if op.prob < 1 and rng.random() >= op.prob:
            continue
        clip = op(clip, rng, ctx, run_ops)
    return clip


def build_degradation(spec: Any, scale: int) -> Degradation:
    """Parse a ``degradations`` option value for ``scale``.

    Raises:
        DegradationError: an invalid value (one line naming the operation, key and value, and what is valid).
    """
    if spec is None:
        raise DegradationError("degradations: null means no degradation; give a preset name or a list of operations")
    if not isinstance(scale, int) or scale < 1:
        raise DegradationError(f"degradations: scale must be a positive integer, got {scale!r}")
    label, ops = _parse(spec)
    for op in ops:
        why = op.check_scale(scale)
        if why:
            raise DegradationError(f"degradations.{op.name}: {why}")
    return Degradation(label, ops, scale)
