"""NETWORKS registry: ``define_G(opt)`` builds ``opt['netG']`` with its keys passed straight to the constructor."""

from __future__ import annotations

import difflib
import inspect
from typing import Any

from torch import nn

from models.network_baseline import VideoConvBaseline
from models.network_rvrt import RVRT
from models.network_vrt import VRT

NETWORKS: dict[str, type[nn.Module]] = {
    "vrt": VRT,
    "rvrt": RVRT,
    "videoconvbaseline": VideoConvBaseline,
}

# KAIR keys in netG that configure weight initialisation rather than the constructor.
META_KEYS = ("net_type", "init_type", "init_bn_type", "init_gain")


def define_network(net_type: str, kwargs: dict[str, Any]) -> nn.Module:
    """Instantiate ``NETWORKS[net_type](**kwargs)``; a key left out takes the constructor default.

    Raises:
        KeyError: unknown ``net_type`` (the message lists the registered ones).
        TypeError: a key the constructor does not take (the message names the closest parameter).
    """
    key = net_type.lower()
    if key not in NETWORKS:
        raise KeyError(f"netG.net_type={net_type!r} is unknown; registered: {sorted(NETWORKS)}")
    cls = NETWORKS[key]
    params = [p for p in inspect.signature(cls.__init__).parameters if p != "self"]
    for name in kwargs:
        if name not in params:
            close = difflib.get_close_matches(name, params, n=1, cutoff=0.5)
            hint = f"; did you mean '{close[0]}'?" if close else f"; valid keys: {', '.join(params)}"
            raise TypeError(f"netG.{name} is not an argument of {cls.__name__}{hint}")
    return cls(**kwargs)


def network_kwargs(opt_net: dict[str, Any]) -> dict[str, Any]:
    """The constructor kwargs of a ``netG`` dict (a copy, without the KAIR meta keys)."""
    return {k: v for k, v in opt_net.items() if k not in META_KEYS}


def is_frame_interpolation(opt_net: dict[str, Any]) -> bool:
    """Whether ``netG`` interpolates frames (VRT with ``pa_frames`` 0): it outputs the frames between its inputs."""
    return str(opt_net.get("net_type", "")).lower() == "vrt" and opt_net.get("pa_frames", 2) == 0


def define_G(opt: dict[str, Any]) -> nn.Module:
    """Build the generator described by ``opt['netG']``."""
    return define_network(opt["netG"]["net_type"], network_kwargs(opt["netG"]))
