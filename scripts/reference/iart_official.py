"""Load the official IART (github.com/kai422/IART, MIT) from a checkout, to compare it with ours.

Nothing of the official code is in this repository: :func:`load_official` reads it from the paths given, applies
the few textual patches listed in :data:`PATCHES` in memory (the checkout is left as it is) and returns its ``IART``
class. Its BasicSR imports (``flow_warp``, ``SpyNet``, the registry) come from a BasicSR checkout, imported module by
module without running BasicSR's package ``__init__`` (which imports every dataset, model and compiled op).

Get the two checkouts (anywhere outside this repository)::

    git clone https://github.com/kai422/IART /tmp/ref_iart/IART
    git clone https://github.com/XPixelGroup/BasicSR /tmp/ref_iart/BasicSR

The patches only let the official network run on the CPU; none changes what it computes:

* ``IART.__init__`` builds its four transformers only ``if torch.cuda.is_available()``: built always;
* ``ImplicitWarpModule.get_sine_position_encoding_points`` makes its frequencies with ``device='cuda'``: on the
  device of its input;
* the ``cpu_cache`` mode (clips longer than ``cpu_cache_length``) moves features back with ``.cuda()``: with
  ``.cpu()`` here, where the computation runs on the CPU (every other step of the mode is unchanged).
"""

from __future__ import annotations

import logging
import sys
import types
from pathlib import Path

# (file under archs/, text, replacement, occurrences expected): an upstream change that moves a patched line fails
PATCHES: dict[str, list[tuple[str, str, int]]] = {
    "iart_arch.py": [("if torch.cuda.is_available():", "if True:", 1), (".cuda()", ".cpu()", 6)],
    "implicit_alignment.py": [("device='cuda'", "device=points.device", 1)],
}
PACKAGE = "iart_official"


def _stub(name: str, path: Path | None = None, **attrs: object) -> types.ModuleType:
    module = types.ModuleType(name)
    if path is not None:
        module.__path__ = [str(path)]
    module.__dict__.update(attrs)
    sys.modules[name] = module
    return module


class _Registry:
    """Stands in for BasicSR's ``ARCH_REGISTRY``: ``register()`` returns the class unchanged."""

    def register(self, obj: object = None):  # noqa: ANN201
        return obj if obj is not None else (lambda cls: cls)


def _basicsr(root: Path) -> None:
    """BasicSR's ``archs.arch_util`` and ``archs.spynet_arch`` importable from the checkout at ``root``."""
    pkg = root / "basicsr"
    if not (pkg / "archs" / "spynet_arch.py").is_file():
        raise SystemExit(f"--basicsr {root}: no basicsr/archs/spynet_arch.py in it")
    _stub("basicsr", pkg)
    _stub("basicsr.archs", pkg / "archs")
    _stub("basicsr.utils", pkg / "utils", get_root_logger=lambda *a, **k: logging.getLogger("basicsr"))
    _stub("basicsr.utils.registry", ARCH_REGISTRY=_Registry())
    _stub("basicsr.ops", pkg / "ops")
    # arch_util imports the compiled deformable convolution by name; IART never uses it
    _stub("basicsr.ops.dcn", ModulatedDeformConvPack=object, modulated_deform_conv=None)


def _load(name: str, path: Path) -> types.ModuleType:
    text = path.read_text()
    for old, new, count in PATCHES.get(path.name, []):
        if text.count(old) != count:
            raise SystemExit(f"{path}: expected {count} occurrence(s) of {old!r} to patch, found {text.count(old)}; "
                             "the official code changed, update PATCHES")
        text = text.replace(old, new)
    module = types.ModuleType(f"{PACKAGE}.{name}")
    module.__file__ = str(path)
    module.__package__ = PACKAGE
    sys.modules[module.__name__] = module
    exec(compile(text, str(path), "exec"), module.__dict__)  # noqa: S102
    return module


def load_official(iart_root: str | Path, basicsr_root: str | Path) -> types.ModuleType:
    """The official ``archs.iart_arch`` module (``.IART``), patched as the module docstring says.

    Args:
        iart_root: a checkout of github.com/kai422/IART (holding ``archs/iart_arch.py``).
        basicsr_root: a checkout of github.com/XPixelGroup/BasicSR (holding ``basicsr/archs/spynet_arch.py``).
    """
    archs = Path(iart_root) / "archs"
    if not (archs / "iart_arch.py").is_file():
        raise SystemExit(f"--iart {iart_root}: no archs/iart_arch.py in it")
    if f"{PACKAGE}.iart_arch" in sys.modules:
        return sys.modules[f"{PACKAGE}.iart_arch"]
    _basicsr(Path(basicsr_root))
    _stub(PACKAGE, archs)
    for name in ("implicit_alignment", "psrt_sliding_arch", "iart_arch"):
        _load(name, archs / f"{name}.py")
    return sys.modules[f"{PACKAGE}.iart_arch"]
