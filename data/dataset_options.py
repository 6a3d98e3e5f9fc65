"""Option handling shared by the dataset classes: every class declares ``OPTIONS: dict[str, Opt]`` (type, default,
doc of each key it reads) and resolves its option dict with :func:`resolve_options` when it is built.

The spec of a dataset section is ``{**DATASET_COMMON, **cls.OPTIONS}`` (:mod:`utils.utils_option_schema`), the
same one ``utils_option.parse(..., dataset_specs=select_dataset.option_specs())`` checks an option file against,
so a dataset built directly (tests, ``main_test_vrt.py``) gets the same defaults and checks of its own keys as one
built from an option file. What the other dataset types read (KAIR's sibling keys, accepted without effect, and the
reader named in an unknown-key error) is known to the registry, which hands it down (``define_Dataset``,
``option_specs``): this module sits below every dataset module and imports none. Defaults are written in the
``Opt`` entries only; the classes read ``opt[key]``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from utils.utils_option import foreign_keys, resolve_section
from utils.utils_option_schema import DATASET_COMMON, NUM, OPTIONAL, Opt

logger = logging.getLogger(__name__)

__all__ = ["AUGMENT", "DATASET_FAMILIES", "NOISE_RANGE", "RGB_CHANNELS", "at_least", "family_of", "only",
           "own_keys", "resolve_options", "spec_of"]

# Dataset types whose option files carry each other's keys: KAIR's video dataset classes (REDS/Vimeo/DVD/GoPro/
# DAVIS train and test sets) ignore the keys of their siblings, and KAIR's recipes keep them (a Vimeo file with
# REDS's `filename_tmpl`, a test set with `val_partition`), so such a key is accepted without effect. The types of
# ours (synthetic clips, video files) are in no family: a key they read is still an error elsewhere.
DATASET_FAMILIES: dict[str, frozenset[str]] = {
    "KAIR video datasets": frozenset({
        "videorecurrenttraindataset", "videorecurrenttrainnonblinddenoisingdataset",
        "videorecurrenttrainvimeodataset", "videorecurrenttrainvimeovfidataset", "videorecurrenttestdataset",
        "singlevideorecurrenttestdataset", "videotestvimeo90kdataset", "vfi_davis", "vfi_ucf101", "vfi_vid4"}),
}


def family_of(kind: str) -> frozenset[str]:
    """The dataset types of ``kind``'s family (``kind`` lower-case; empty when it has none)."""
    return next((members for members in DATASET_FAMILIES.values() if kind in members), frozenset())


def at_least(bound: float) -> Callable[[Any], str | None]:
    """A ``refuse`` check for a number that must be ``>= bound`` (``None`` passes: its own type check decides)."""
    def refuse(value: Any) -> str | None:
        return f"must be >= {bound}" if value is not None and value < bound else None
    return refuse


def only(allowed: Any, why: str) -> Callable[[Any], str | None]:
    """A ``refuse`` check that accepts ``allowed`` alone (the value meaning "off" or "default") and gives ``why``."""
    def refuse(value: Any) -> str | None:
        return None if value == allowed else why
    return refuse


RGB_CHANNELS = Opt(int, OPTIONAL, "Image channels (default: the top-level `n_channels`); frames are read as RGB, so "
                   "only 3.", refuse=only(3, "frames are read as 3-channel RGB"))
# the reference's augmentation, drawn per item and shared by every frame of the clip (LQ and GT)
AUGMENT: dict[str, Opt] = {
    "use_hflip": Opt(bool, True, "Flip horizontally with probability 0.5 (one draw for all frames, LQ and GT)."),
    "use_rot": Opt(bool, True, "Flip vertically, then transpose, each with probability 0.5 (one draw per clip); "
                   "with `use_hflip` these give the 8 rotations/reflections."),
}
# non-blind denoising training: one noise level per clip
NOISE_RANGE: dict[str, Opt] = {
    "sigma_min": Opt(NUM, 0, "Smallest noise std on the [0, 255] scale; each clip draws one sigma from "
                     "U[sigma_min, sigma_max] for all its frames.", refuse=at_least(0)),
    "sigma_max": Opt(NUM, 50, "Largest noise std on the [0, 255] scale (at least `sigma_min`).", refuse=at_least(0)),
}


def spec_of(cls: type) -> dict[str, Opt]:
    """The full spec of a dataset class's section: ``{**DATASET_COMMON, **cls.OPTIONS}``."""
    return {**DATASET_COMMON, **cls.OPTIONS}


def resolve_options(cls: type, opt: dict[str, Any], specs: Mapping[str, Mapping[str, Opt]] | None = None
                    ) -> dict[str, Any]:
    """Check a dataset's option dict against its class's spec and fill the defaults.

    ``dataset_type`` defaults to the class name (a dataset built directly knows its type). Keys that are accepted
    for KAIR compatibility but have no effect (``Opt.note``) are logged.

    Args:
        cls: the dataset class (its ``OPTIONS``).
        opt: the section as written or as parsed; not modified.
        specs: the ``OPTIONS`` of every registered dataset type (``data.select_dataset.option_specs()``; the
            registry passes them, this module does not import it): a key of a sibling type of ``cls``'s family is
            then dropped with a note, and an unknown key that another type reads is named with its reader. Without
            them (a class built directly) every key must be ``cls``'s own.

    Returns:
        A new dict holding every key of the spec that has a default.

    Raises:
        utils.utils_option.OptionError: unknown key (with the closest known one), wrong type, invalid or refused
            value, missing required key; the message names ``<ClassName>.<key>``.
    """
    spec = spec_of(cls)
    values = {"dataset_type": cls.__name__, **opt}
    kind = cls.__name__.lower()
    siblings, others = foreign_keys(specs, kind, family_of(kind)) if specs is not None else (None, None)
    resolved = resolve_section(values, spec, where=cls.__name__, family=siblings, elsewhere=others)
    for key in opt:
        if key in spec and spec[key].note:
            logger.info("%s: option '%s' has no effect: %s", cls.__name__, key, spec[key].note)
    return resolved


def own_keys(cls: type, opt: Mapping[str, Any], specs: Mapping[str, Mapping[str, Opt]]) -> dict[str, Any]:
    """The keys of ``opt`` that ``cls`` reads, as written, after the whole section was checked with every type's
    ``specs`` (:func:`resolve_options`: a sibling type's key is dropped with a note; an unknown key is an error
    naming the type that reads it). Nothing else is logged: the class resolves the result when it is built."""
    spec = spec_of(cls)
    kind = cls.__name__.lower()
    siblings, others = foreign_keys(specs, kind, family_of(kind))
    resolve_section({"dataset_type": cls.__name__, **opt}, spec, where=cls.__name__, family=siblings,
                    elsewhere=others)
    return {k: v for k, v in opt.items() if k in spec}
