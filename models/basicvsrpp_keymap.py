"""Key map from the released mmediting/mmagic BasicVSR++ checkpoints to BasicSR's state-dict names (ours).

The released files hold ``{'meta': ..., 'state_dict': {'generator.<name>': tensor, ...}}`` (the state dict is
found by :func:`utils.utils_checkpoint.extract_state_dict`). Their generator differs from BasicSR's port by name
only:

* ``generator.`` prefixes every key; other top-level entries (``step_counter`` of mmagic's BasicVSR model, a
  discriminator) are not the generator's and are dropped;
* SpyNet's convolutions sit in mmcv ``ConvModule``s (``basic_module.<i>.basic_module.<j>.conv.*``, j = 0..4)
  where BasicSR has a plain Sequential with ReLUs between (``basic_module.<i>.basic_module.<2j>.*``);
* the upsampling convolutions sit in ``PixelShufflePack``s (``upsample1.upsample_conv.*``,
  ``upsample2.upsample_conv.*``) where BasicSR has ``upconv1.*``, ``upconv2.*``.

Every other name (``feat_extract``, ``deform_align.<branch>.{weight,bias,conv_offset.*}``,
``backbone.<branch>.main.*``, ``reconstruction``, ``conv_hr``, ``conv_last``, SpyNet's ``mean``/``std``) is the
same in both.
"""

from __future__ import annotations

import re

from torch import Tensor

__all__ = ["from_mmagic", "to_mmagic"]

_SPYNET_MM = re.compile(r"^spynet\.basic_module\.(\d+)\.basic_module\.(\d+)\.conv\.(weight|bias)$")
_SPYNET_OURS = re.compile(r"^spynet\.basic_module\.(\d+)\.basic_module\.(\d+)\.(weight|bias)$")
_UPSAMPLE = {"upsample1.upsample_conv.": "upconv1.", "upsample2.upsample_conv.": "upconv2."}


def _rename(key: str) -> str:
    match = _SPYNET_MM.match(key)
    if match:
        level, index, kind = match.groups()
        return f"spynet.basic_module.{level}.basic_module.{2 * int(index)}.{kind}"
    for old, new in _UPSAMPLE.items():
        if key.startswith(old):
            return new + key[len(old):]
    return key


def from_mmagic(state_dict: dict[str, Tensor]) -> dict[str, Tensor]:
    """Our names for a released mmediting/mmagic BasicVSR++ state dict; a BasicSR-format dict passes unchanged.

    Args:
        state_dict: ``{'generator.spynet.basic_module.0.basic_module.0.conv.weight': ..., ...}`` (the
            ``generator.`` prefix may already be stripped), or a state dict in BasicSR's names.

    Returns:
        ``{'spynet.basic_module.0.basic_module.0.weight': ..., 'upconv1.weight': ..., ...}`` (the same tensors).
    """
    if any(k.startswith("generator.") for k in state_dict):
        state_dict = {k[len("generator."):]: v for k, v in state_dict.items() if k.startswith("generator.")}
    return {_rename(k): v for k, v in state_dict.items()}


def to_mmagic(state_dict: dict[str, Tensor]) -> dict[str, Tensor]:
    """The inverse of :func:`from_mmagic`: our state dict in the released files' names (``generator.`` prefixed)."""
    out = {}
    for key, value in state_dict.items():
        match = _SPYNET_OURS.match(key)
        if match:
            level, index, kind = match.groups()
            key = f"spynet.basic_module.{level}.basic_module.{int(index) // 2}.conv.{kind}"
        for old, new in _UPSAMPLE.items():
            if key.startswith(new):
                key = old + key[len(new):]
        out["generator." + key] = value
    return out
