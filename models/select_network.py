"""NETWORKS registry: ``define_G(opt)`` builds ``opt['netG']`` with its keys passed straight to the constructor."""

from __future__ import annotations

import inspect
import os
import re
import types
import typing
from collections.abc import Sequence
from typing import Any

from torch import nn

from models.network_baseline import VideoConvBaseline
from models.network_basicvsrpp import BasicVSRPlusPlus
from models.network_iart import IART
from models.network_rvrt import RVRT
from models.network_vrt import VRT
from utils.utils_option import NETWORK_META, check_network
from utils.utils_option_schema import ANY, OPTIONAL, Opt

NETWORKS: dict[str, type[nn.Module]] = {
    "vrt": VRT,
    "rvrt": RVRT,
    "videoconvbaseline": VideoConvBaseline,
    "basicvsrpp": BasicVSRPlusPlus,
    "iart": IART,
}

# KAIR keys in netG that configure weight initialisation rather than the constructor.
META_KEYS = tuple(NETWORK_META)


def define_network(net_type: str, kwargs: dict[str, Any]) -> nn.Module:
    """Instantiate ``NETWORKS[net_type](**kwargs)``; a key left out takes the constructor default.

    Raises:
        utils.utils_option.OptionError: unknown ``net_type`` (listing the registered ones), an argument the
            constructor does not take (naming the closest one) or a value of the wrong type.
    """
    check_network({"net_type": net_type, **kwargs}, network_specs())
    return NETWORKS[net_type.lower()](**kwargs)


def network_kwargs(opt_net: dict[str, Any]) -> dict[str, Any]:
    """The constructor kwargs of a ``netG`` dict (a copy, without the KAIR meta keys)."""
    return {k: v for k, v in opt_net.items() if k not in META_KEYS}


def _json_types(annotation: Any) -> Any:
    """The JSON value types a constructor annotation admits (``ANY`` when it is not a JSON type)."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        parts = [_json_types(a) for a in typing.get_args(annotation)]
        if any(p is ANY for p in parts):
            return ANY
        return tuple(dict.fromkeys(t for p in parts for t in (p if isinstance(p, tuple) else (p,))))
    if annotation is type(None):
        return type(None)
    if annotation is os.PathLike or origin is os.PathLike:
        return str
    if annotation is float:
        return (int, float)
    if annotation in (int, bool, str):
        return annotation
    if origin in (list, tuple, Sequence) or annotation in (list, tuple):
        return list
    return ANY


def _arg_docs(cls: type) -> dict[str, str]:
    """``{argument: text}`` from the ``Args:`` block of a Google-style class docstring (``a, b: text`` too)."""
    docs: dict[str, str] = {}
    text = inspect.getdoc(cls) or ""
    block = text.split("Args:", 1)[1] if "Args:" in text else ""
    current: list[str] = []
    for line in block.splitlines():
        match = re.match(r"^    ([\w, *]+): (.*)$", line)
        if match:
            current = [n.strip(" *") for n in match.group(1).split(",")]
            for name in current:
                docs[name] = match.group(2).strip()
        elif line.startswith("        ") and current:
            for name in current:
                docs[name] += " " + line.strip()
        elif line.strip() and not line.startswith(" "):
            break
    return docs


def _not_settable(name: str) -> Any:
    return lambda value: f"'{name}' takes a Python class and cannot be set from an option file (leave it out)"


def network_spec(cls: type[nn.Module]) -> dict[str, Opt]:
    """The ``netG`` schema of a network: its constructor's arguments (types from the annotations, defaults left to
    the constructor, docs from its docstring)."""
    hints = typing.get_type_hints(cls.__init__)
    docs = _arg_docs(cls)
    params = inspect.signature(cls.__init__).parameters
    spec = {}
    for name, param in params.items():
        if name == "self" or param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        default = param.default if param.default is not param.empty else None
        shown = list(default) if isinstance(default, tuple) else default
        doc = docs.get(name, "")
        doc = f"{doc} Default: `{shown!r}`." if param.default is not param.empty else doc
        hint = hints.get(name, Any)
        refuse = None
        if typing.get_origin(hint) is type:  # a class argument (e.g. norm_layer): the constructor default only
            refuse = _not_settable(name)
        spec[name] = Opt(_json_types(hint), OPTIONAL, doc.strip(), refuse=refuse)
    return spec


def network_specs() -> dict[str, dict[str, Opt]]:
    """``{net_type: netG schema}`` of every registered network (for option checking and the docs)."""
    return {name: network_spec(cls) for name, cls in NETWORKS.items()}


def define_G(opt: dict[str, Any]) -> nn.Module:
    """Build the generator described by ``opt['netG']``."""
    return define_network(opt["netG"]["net_type"], network_kwargs(opt["netG"]))
