"""The operations of a degradation pipeline (:mod:`data.degradation_pipeline`), one class per ``type``.

Each class declares its keys in ``PARAMS`` (``Opt`` entries: type, default, doc, check; ``prob`` is common to all),
draws the parameters of one clip from the clip's generator in a fixed order, and applies the functions of
:mod:`data.degradations` / :mod:`data.degradation_codec`. A range is ``[low, high]`` (one number: that value) and is
drawn uniformly; ``vary`` (0..1) makes a parameter drift linearly from its first-frame value to a last-frame value
within ``vary x (high - low)`` of it (inside the range), instead of one value for all frames.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from data import degradations as dg
from data.degradation_codec import CRF_RANGE, QSCALE_RANGE, X26X_PRESETS, check_codec, compress_clip, encoder_name
from utils.utils_option import OptionError
from utils.utils_option_schema import NUM, REQUIRED, Opt

__all__ = ["OPERATIONS", "Clip", "Context", "DegradationError", "Operation"]

Clip = np.ndarray  # (T, H, W, 3) uint8 levels or float in [0, 1]
KERNELS = ("iso", "aniso", "generalized_iso", "generalized_aniso", "plateau_iso", "plateau_aniso", "sinc")
KERNEL_ALIASES = {"generalized": "generalized_aniso", "plateau": "plateau_aniso"}


class DegradationError(OptionError):
    """An invalid ``degradations`` option, as one line naming the operation, the key and what is valid."""


@dataclass(frozen=True)
class Context:
    """What an operation may need besides the clip: the final LQ size ``(h, w)`` and the scale."""

    target: tuple[int, int]
    scale: int


# ------------------------------------------------------------------------------------------------- value checks
def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _range(lo: float, hi: float, integer: bool = False, odd: bool = False) -> Callable[[Any], str | None]:
    kind = "odd integers" if odd else "integers" if integer else "numbers"

    def refuse(value: Any) -> str | None:
        pair = [value, value] if _is_num(value) else value
        if not (isinstance(pair, list) and len(pair) == 2 and all(_is_num(v) for v in pair)):
            return f"must be a number or [low, high] of {kind} in [{lo:g}, {hi:g}]"
        a, b = pair
        whole = all(float(v).is_integer() for v in pair)
        if (integer or odd) and not whole or odd and not all(v % 2 == 1 for v in pair):
            return f"must be {kind}"
        if not lo <= a <= b <= hi:
            return f"must satisfy {lo:g} <= low <= high <= {hi:g}"
        return None
    return refuse


def _unit(value: Any) -> str | None:
    return None if 0 <= value <= 1 else "must be in [0, 1]"


def _weights(count: int | None) -> Callable[[Any], str | None]:
    def refuse(value: Any) -> str | None:
        if value is None:
            return None
        ok = isinstance(value, list) and all(_is_num(v) and v >= 0 for v in value) and sum(value) > 0
        if not ok or (count is not None and len(value) != count):
            size = f"{count} " if count else ""
            return f"must be a list of {size}non-negative weights with a positive sum"
        return None
    return refuse


def _names(valid: tuple[str, ...], aliases: dict[str, str] | None = None) -> Callable[[Any], str | None]:
    def refuse(value: Any) -> str | None:
        items = [value] if isinstance(value, str) else value
        ok = isinstance(items, list) and items and all(isinstance(v, str) for v in items)
        bad = [v for v in items if v not in valid and v not in (aliases or {})] if ok else items
        if not ok or bad:
            alias = f" (or {', '.join(aliases)})" if aliases else ""
            return f"must be one or a list of: {', '.join(valid)}{alias}"
        return None
    return refuse


def _as_list(value: Any) -> list[Any]:
    return [value] if not isinstance(value, list) else list(value)


def _pair(value: Any) -> tuple[float, float]:
    return (float(value), float(value)) if _is_num(value) else (float(value[0]), float(value[1]))


def _choose(rng: np.random.Generator, items: list[Any], weights: list[float] | None) -> Any:
    """One item, by ``weights`` (uniform when ``None``); draws even for a single item (a fixed draw order)."""
    p = None if weights is None else np.asarray(weights, np.float64) / float(np.sum(weights))
    return items[int(rng.choice(len(items), p=p))]


def _series(rng: np.random.Generator, bounds: Any, frames: int, vary: float) -> np.ndarray:
    """``(frames,)`` values of a parameter: uniform in ``bounds``, drifting linearly by up to ``vary`` of the range."""
    lo, hi = _pair(bounds)
    start = rng.uniform(lo, hi)
    if vary <= 0 or frames == 1:
        return np.full(frames, start)
    reach = vary * (hi - lo)
    end = rng.uniform(max(lo, start - reach), min(hi, start + reach))
    return np.linspace(start, end, frames)


PROB = Opt(NUM, 1.0, "Chance that the operation runs on a clip.", refuse=_unit)
VARY = Opt(NUM, 0.0, "Drift of the parameters over the frames, as a fraction of their range (0: one value per "
           "clip).", refuse=_unit)


# -------------------------------------------------------------------------------------------------- operations
class Operation:
    """One step of a pipeline. ``PARAMS``: its keys besides ``type`` and ``name``.

    Args:
        name: unique within the pipeline (what preset changes and error messages refer to).
        params: the resolved keys (defaults filled).
        children: the operation lists of a ``shuffle``.
    """

    PARAMS: dict[str, Opt] = {"prob": PROB}

    def __init__(self, name: str, params: dict[str, Any], children: list[list[Operation]] | None = None) -> None:
        self.name = name
        self.params = params
        self.prob = float(params["prob"])
        self.children = children or []
        self.setup()

    def setup(self) -> None:
        """Check keys against each other (raise :class:`DegradationError`) and precompute."""

    def check_scale(self, scale: int) -> str | None:
        """Why the operation cannot run at ``scale``, or ``None``."""
        return next((why for group in self.children for op in group if (why := op.check_scale(scale))), None)

    def __call__(self, clip: Clip, rng: np.random.Generator, ctx: Context, run: Callable[..., Clip]) -> Clip:
        """Degrade ``clip`` (not modified) with parameters drawn from ``rng``; returns a new array."""
        raise NotImplementedError

    def summary(self) -> str:
        return ""

    def describe(self) -> str:
        prob = f" p={self.prob:g}" if self.prob < 1 else ""
        return f"{self.name}({self.summary()}{prob})"

    def _error(self, key: str, why: str) -> DegradationError:
        return DegradationError(f"option 'degradations.{self.name}.{key}' = {self.params.get(key)!r}: {why}")


class Blur(Operation):
    """Blur every frame with a random kernel (one per clip, or one per frame with ``vary``)."""

    PARAMS = {
        "prob": PROB,
        "kernel": Opt((str, list), list(KERNELS), "Kernel types to choose from: "
                      f"{', '.join(f'`{k}`' for k in KERNELS)} (`iso` and `aniso` are Gaussian).",
                      refuse=_names(KERNELS, KERNEL_ALIASES)),
        "kernel_prob": Opt((list, type(None)), None, "Weights of `kernel` (null: equal).", refuse=_weights(None)),
        "kernel_size": Opt((int, list), [7, 21], "Odd kernel sizes to draw from.", refuse=_range(3, 101, odd=True)),
        "sigma": Opt((int, float, list), [0.2, 3.0], "Gaussian std along each axis (pixels).",
                     refuse=_range(0.01, 50)),
        "beta_gaussian": Opt((int, float, list), [0.5, 4.0], "Shape of the generalized Gaussian.",
                             refuse=_range(0.05, 20)),
        "beta_plateau": Opt((int, float, list), [1.0, 2.0], "Shape of the plateau kernel.", refuse=_range(0.05, 20)),
        "omega": Opt((int, float, list, type(None)), None, "Sinc cut-off in rad/pixel (null: [pi/3, pi] for kernels "
                     "under 13 taps, else [pi/5, pi], as Real-ESRGAN).", refuse=lambda v: None if v is None else
                     _range(0.05, math.pi + 1e-6)(v)),
        "vary": VARY,
    }

    def setup(self) -> None:
        self.kinds = [KERNEL_ALIASES.get(k, k) for k in _as_list(self.params["kernel"])]
        weights = self.params["kernel_prob"]
        if weights is not None and len(weights) != len(self.kinds):
            raise self._error("kernel_prob", f"needs one weight per kernel ({len(self.kinds)})")

    def draw_kernels(self, rng: np.random.Generator, frames: int) -> tuple[str, np.ndarray]:
        """``(kind, kernels)``: ``(k, k)`` for the clip, or ``(frames, k, k)`` when ``vary`` > 0."""
        p, vary = self.params, float(self.params["vary"])
        kind = _choose(rng, self.kinds, p["kernel_prob"])
        lo, hi = (int(v) for v in _pair(p["kernel_size"]))
        size = 2 * int(rng.integers(lo // 2, hi // 2 + 1)) + 1
        n = frames if vary > 0 else 1
        if kind == "sinc":
            omega = p["omega"] if p["omega"] is not None else [math.pi / 3 if size < 13 else math.pi / 5, math.pi]
            kernels = [dg.sinc_kernel(size, w) for w in _series(rng, omega, n, vary)]
        else:
            sx = _series(rng, p["sigma"], n, vary)
            sy, angle = (sx, np.zeros(n)) if kind.endswith("iso") and not kind.endswith("aniso") else (
                _series(rng, p["sigma"], n, vary), _series(rng, [-math.pi, math.pi], n, vary))
            if kind.startswith("generalized"):
                beta = _series(rng, p["beta_gaussian"], n, vary)
                kernels = [dg.generalized_gaussian_kernel(size, *a) for a in zip(sx, sy, angle, beta)]
            elif kind.startswith("plateau"):
                beta = _series(rng, p["beta_plateau"], n, vary)
                kernels = [dg.plateau_kernel(size, *a) for a in zip(sx, sy, angle, beta)]
            else:
                kernels = [dg.gaussian_kernel(size, *a) for a in zip(sx, sy, angle)]
        return kind, kernels[0] if n == 1 else np.stack(kernels)

    def __call__(self, clip: Clip, rng: np.random.Generator, ctx: Context, run: Callable[..., Clip]) -> Clip:
        return dg.filter_clip(clip, self.draw_kernels(rng, clip.shape[0])[1])

    def summary(self) -> str:
        p = self.params
        shape = f"omega {p['omega'] or 'auto'}" if self.kinds == ["sinc"] else f"sigma {p['sigma']}"
        vary = f"; vary {p['vary']:g}" if p["vary"] else ""
        return f"{'/'.join(self.kinds)}; size {p['kernel_size']}; {shape}{vary}"


class Resize(Operation):
    """Resize by a random factor (up / down / keep), or to the final LQ size (``to: target``)."""

    PARAMS = {
        "prob": PROB,
        "to": Opt(str, "scale", "`scale`: by a random factor; `target`: to exactly GT / scale.",
                  choices=("scale", "target")),
        "scale": Opt((int, float, list), [0.15, 1.5], "Factor range, low <= 1 <= high: up draws in [1, high], down "
                     "in [low, 1].", refuse=lambda v: _range(0.01, 16)(v) or (
                         None if _pair(v)[0] <= 1 <= _pair(v)[1] else "must satisfy low <= 1 <= high")),
        "direction_prob": Opt(list, [0.2, 0.7, 0.1], "Weights of up, down, keep.", refuse=_weights(3)),
        "relative_to": Opt(str, "input", "Size the factor applies to: the clip as it comes (`input`) or GT / scale "
                           "(`target`, Real-ESRGAN's second resize).", choices=("input", "target")),
        "mode": Opt((str, list), list(dg.RESIZE_MODES), "Interpolations to choose from.",
                    refuse=_names(tuple(dg.RESIZE_MODES))),
        "mode_prob": Opt((list, type(None)), None, "Weights of `mode` (null: equal).", refuse=_weights(None)),
    }

    def setup(self) -> None:
        self.modes = _as_list(self.params["mode"])
        if self.params["mode_prob"] is not None and len(self.params["mode_prob"]) != len(self.modes):
            raise self._error("mode_prob", f"needs one weight per mode ({len(self.modes)})")

    def __call__(self, clip: Clip, rng: np.random.Generator, ctx: Context, run: Callable[..., Clip]) -> Clip:
        p = self.params
        if p["to"] == "target":
            size = ctx.target
        else:
            lo, hi = _pair(p["scale"])
            direction = _choose(rng, ["up", "down", "keep"], p["direction_prob"])
            factor = {"up": lambda: rng.uniform(1, hi), "down": lambda: rng.uniform(lo, 1), "keep": lambda: 1.0}
            f = factor[direction]()
            base = ctx.target if p["relative_to"] == "target" else clip.shape[1:3]
            size = (max(1, int(base[0] * f + 0.5)), max(1, int(base[1] * f + 0.5)))
        mode = _choose(rng, self.modes, p["mode_prob"])
        return dg.resize_clip(clip, size, mode)

    def summary(self) -> str:
        if self.params["to"] == "target":
            return f"to GT/scale; {'/'.join(self.modes)}"
        return f"x{self.params['scale']} of {self.params['relative_to']}; {'/'.join(self.modes)}"


class Noise(Operation):
    """Gaussian or Poisson noise, per channel or grey (luminance), then clipped to [0, 1]."""

    PARAMS = {
        "prob": PROB,
        "gaussian_prob": Opt(NUM, 0.5, "Chance of Gaussian noise; otherwise Poisson.", refuse=_unit),
        "sigma": Opt((int, float, list), [1.0, 30.0], "Gaussian std on the [0, 255] scale.", refuse=_range(0, 255)),
        "poisson_scale": Opt((int, float, list), [0.05, 3.0], "Multiplier of the Poisson (shot) noise of the 8-bit "
                             "levels (std sqrt(level) / 255 at 1).", refuse=_range(0, 50)),
        "gray_prob": Opt(NUM, 0.4, "Chance of grey noise (one value for the three channels).", refuse=_unit),
        "vary": VARY,
    }

    def __call__(self, clip: Clip, rng: np.random.Generator, ctx: Context, run: Callable[..., Clip]) -> Clip:
        p = self.params
        gaussian = rng.random() < p["gaussian_prob"]
        gray = rng.random() < p["gray_prob"]
        level = _series(rng, p["sigma"] if gaussian else p["poisson_scale"], clip.shape[0], float(p["vary"]))
        if gaussian:
            return dg.add_gaussian_noise(clip, level, gray, rng)
        return dg.add_poisson_noise(clip, level, gray, rng)

    def summary(self) -> str:
        vary = f"; vary {self.params['vary']:g}" if self.params["vary"] else ""
        return f"gaussian {self.params['sigma']} or poisson {self.params['poisson_scale']}{vary}"


class Jpeg(Operation):
    """JPEG compression of every frame (quality drawn per clip, or drifting with ``vary``)."""

    PARAMS = {
        "prob": PROB,
        "quality": Opt((int, list), [30, 95], "JPEG quality (1..100; higher is better).",
                       refuse=_range(1, 100, integer=True)),
        "vary": VARY,
    }

    def __call__(self, clip: Clip, rng: np.random.Generator, ctx: Context, run: Callable[..., Clip]) -> Clip:
        quality = np.rint(_series(rng, self.params["quality"], clip.shape[0], float(self.params["vary"])))
        return dg.jpeg_clip(clip, quality.astype(int))

    def summary(self) -> str:
        return f"quality {self.params['quality']}"


class Codec(Operation):
    """Video-codec compression of the whole clip in memory (:func:`data.degradation_codec.compress_clip`)."""

    PARAMS = {
        "prob": PROB,
        "codec": Opt((str, list), ["libx264"], "Encoders to choose from: `libx264`, `libx265`, `mpeg4`, "
                     "`libvpx-vp9` (aliases `h264`, `h265`, `vp9`), those in the installed PyAV."),
        "codec_prob": Opt((list, type(None)), None, "Weights of `codec` (null: equal).", refuse=_weights(None)),
        "crf": Opt((int, list), [18, 35], "Constant rate factor of libx264 / libx265 (0..51) and libvpx-vp9 "
                   "(0..63); higher is worse.", refuse=_range(0, 63, integer=True)),
        "qscale": Opt((int, list), [2, 20], "Fixed quantiser of mpeg4 (2..31); higher is worse.",
                      refuse=_range(*QSCALE_RANGE, integer=True)),
        "bitrate": Opt((int, float, list, type(None)), None, "Bits per second at `fps`, for every codec, instead of "
                       "`crf` / `qscale` (null: those).", refuse=lambda v: None if v is None else _range(1e3, 1e9)(v)),
        "fps": Opt(int, 25, "Frame rate of the stream (what a `bitrate` is spread over).",
                   refuse=lambda v: None if v >= 1 else "must be >= 1"),
        "preset": Opt(str, "medium", "x264 / x265 speed preset.", choices=X26X_PRESETS),
    }

    def setup(self) -> None:
        self.codecs = _as_list(self.params["codec"])
        if not self.codecs:
            raise self._error("codec", "needs at least one codec")
        for codec in self.codecs:
            why = check_codec(codec) if isinstance(codec, str) else "codec names are strings"
            if why:
                raise self._error("codec", why)
        self.codecs = [encoder_name(c) for c in self.codecs]
        if self.params["codec_prob"] is not None and len(self.params["codec_prob"]) != len(self.codecs):
            raise self._error("codec_prob", f"needs one weight per codec ({len(self.codecs)})")
        crf_max = min((CRF_RANGE[c][1] for c in self.codecs if c in CRF_RANGE), default=63)
        if self.params["bitrate"] is None and _pair(self.params["crf"])[1] > crf_max:
            raise self._error("crf", f"must be <= {crf_max} for {', '.join(self.codecs)}")

    def __call__(self, clip: Clip, rng: np.random.Generator, ctx: Context, run: Callable[..., Clip]) -> Clip:
        p = self.params
        codec = _choose(rng, self.codecs, p["codec_prob"])
        rate: dict[str, Any] = {}
        if p["bitrate"] is not None:
            rate["bitrate"] = rng.uniform(*_pair(p["bitrate"]))
        else:
            key = "qscale" if codec == "mpeg4" else "crf"
            lo, hi = _pair(p[key])
            rate[key] = int(rng.integers(int(lo), int(hi) + 1))
        return compress_clip(clip, codec, fps=p["fps"], preset=p["preset"], **rate)

    def summary(self) -> str:
        rate = f"bitrate {self.params['bitrate']}" if self.params["bitrate"] is not None else \
            f"crf {self.params['crf']}" + (f", qscale {self.params['qscale']}" if "mpeg4" in self.codecs else "")
        return f"{'/'.join(self.codecs)}; {rate}"


class BI(Operation):
    """The BI downsampling of the benchmarks: MATLAB bicubic by 1 / scale (float64)."""

    def __call__(self, clip: Clip, rng: np.random.Generator, ctx: Context, run: Callable[..., Clip]) -> Clip:
        return dg.bi_downsample(clip, ctx.scale)

    def summary(self) -> str:
        return "MATLAB bicubic"


class BD(Operation):
    """The BD downsampling of the benchmarks: MATLAB Gaussian blur, then every scale-th pixel (float64)."""

    PARAMS = {"prob": PROB, "sigma": Opt(NUM, 1.6, "Gaussian std (the benchmarks use 1.6).",
                                         refuse=lambda v: None if 0.1 <= v <= 10 else "must be in [0.1, 10]")}

    def check_scale(self, scale: int) -> str | None:
        return None if scale >= 2 else "bd needs a scale of at least 2"

    def __call__(self, clip: Clip, rng: np.random.Generator, ctx: Context, run: Callable[..., Clip]) -> Clip:
        return dg.bd_downsample(clip, ctx.scale, float(self.params["sigma"]))

    def summary(self) -> str:
        return f"sigma {self.params['sigma']:g}"


class Quantize(Operation):
    """Round to the 8-bit levels (as saved frames are)."""

    def __call__(self, clip: Clip, rng: np.random.Generator, ctx: Context, run: Callable[..., Clip]) -> Clip:
        return dg.quantize(clip)


class Shuffle(Operation):
    """Run groups of operations in a random order (Real-ESRGAN's final JPEG vs resize + sinc)."""

    PARAMS = {"prob": PROB, "groups": Opt(list, REQUIRED, "Lists of operations; the lists run in a random order.",
                                          refuse=lambda v: None if v and all(isinstance(g, list) for g in v) else
                                          "must be a non-empty list of lists of operations")}

    def __call__(self, clip: Clip, rng: np.random.Generator, ctx: Context, run: Callable[..., Clip]) -> Clip:
        for g in rng.permutation(len(self.children)):
            clip = run(self.children[int(g)], clip, rng, ctx)
        return clip

    def summary(self) -> str:
        return " | ".join(" -> ".join(op.describe() for op in group) for group in self.children)

    def describe(self) -> str:
        prob = f" p={self.prob:g}" if self.prob < 1 else ""
        return f"{self.name}(any order: {self.summary()}{prob})"


OPERATIONS: dict[str, type[Operation]] = {
    "blur": Blur, "resize": Resize, "noise": Noise, "jpeg": Jpeg, "codec": Codec, "bi": BI, "bd": BD,
    "quantize": Quantize, "shuffle": Shuffle,
}
