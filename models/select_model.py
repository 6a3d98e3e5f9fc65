"""MODELS registry: ``define_Model(opt, dist_info)`` picks the training model class from ``opt['model']``."""

from __future__ import annotations

from typing import Any

from models.model_base import ModelBase
from models.model_gan import ModelGAN
from models.model_plain import ModelPlain
from models.model_vrt import ModelVRT
from utils.utils_dist import DistInfo

MODELS: dict[str, type[ModelBase]] = {
    "plain": ModelPlain,
    "vrt": ModelVRT,
    "rvrt": ModelVRT,
    "gan": ModelGAN,
}


def define_Model(opt: dict[str, Any], dist_info: DistInfo) -> ModelBase:
    """Instantiate ``MODELS[opt['model']]``.

    Raises:
        KeyError: unknown model name (the message lists the registered ones).
    """
    name = opt.get("model", "vrt").lower()
    if name not in MODELS:
        raise KeyError(f"model={opt.get('model')!r} is unknown; registered: {sorted(MODELS)}")
    return MODELS[name](opt, dist_info)
