"""Option files: parse, validate, override and save KAIR-format JSON experiment files.

A KAIR option file loads unchanged: ``//`` comments (outside strings, so ``"http://..."`` survives), every key
KAIR's VRT/RVRT files use, KAIR's defaults where they still mean something. Unlike KAIR, an unknown or misspelt
key is an error naming the closest known key, a wrong type is an error naming the expected type, and parsing
has no side effects (no ``CUDA_VISIBLE_DEVICES`` write, no print, no mkdir). The schema is
:mod:`utils.utils_option_schema`; ``netG`` is checked against its network's constructor and each dataset section
against its dataset class (specs passed in by the flows, so that this bottom layer imports neither).
"""

from __future__ import annotations

import copy
import difflib
import json
import logging
import os
import sys
import time
from collections.abc import Collection, Iterable, Mapping
from typing import Any

from utils import utils_dist
from utils.utils_fs import atomic_open
from utils.utils_option_schema import ANY, DATASET_COMMON, OPTIONAL, REQUIRED, SCHEMA, Opt

logger = logging.getLogger(__name__)

Specs = dict[str, dict[str, Opt]]
# netG keys of KAIR that configure weight initialisation rather than the constructor
NETWORK_META: dict[str, Opt] = {
    "net_type": Opt(str, REQUIRED, "The network class."),
    "init_type": Opt(str, OPTIONAL, "KAIR's weight initialisation; only `default` (the constructor's own).",
                     refuse=lambda v: None if v == "default" else "only 'default' (the constructor's initialisation)"
                     " is supported"),
    "init_bn_type": Opt(ANY, OPTIONAL, "KAIR's BatchNorm initialisation (unused)."),
    "init_gain": Opt(ANY, OPTIONAL, "KAIR's initialisation gain (unused)."),
}
DATASET_PATH_KEYS = ("dataroot_gt", "dataroot_lq", "dataroot_H", "dataroot_L", "meta_info_file", "dataroot_flow")


class OptionError(ValueError):
    """A problem in an option file or an override, reported as one line."""


def strip_json_comments(text: str) -> str:
    """Remove ``//`` comments that are outside JSON strings (line structure is kept for error positions)."""
    out: list[str] = []
    in_str = escaped = False
    i = 0
    while i < len(text):
        ch = text[i]
        if in_str:
            out.append(ch)
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_str = False
        elif ch == '"':
            in_str = True
            out.append(ch)
        elif text.startswith("//", i):
            while i < len(text) and text[i] != "\n":
                i += 1
            continue
        else:
            out.append(ch)
        i += 1
    return "".join(out)


def load_json(path: str) -> dict[str, Any]:
    """Read a KAIR option file (``//`` comments allowed).

    Raises:
        OptionError: missing file, malformed JSON (with file, line and column), or not a JSON object.
    """
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as exc:
        raise OptionError(f"cannot read option file {path}: {exc.strerror}") from exc
    try:
        data = json.loads(strip_json_comments(text))
    except json.JSONDecodeError as exc:
        raise OptionError(f"{path}:{exc.lineno}:{exc.colno}: malformed JSON: {exc.msg}") from exc
    if not isinstance(data, dict):
        raise OptionError(f"{path}: the top level must be a JSON object, got {type(data).__name__}")
    return data


def _type_name(types: Any) -> str:
    types = types if isinstance(types, tuple) else (types,)
    names = {int: "integer", float: "number", str: "string", bool: "boolean", list: "list", dict: "object",
             type(None): "null"}
    return " or ".join(dict.fromkeys(names.get(t, t.__name__) for t in types))


def check_value(dotted: str, value: Any, spec: Opt) -> None:
    """Type, choices and support of one value.

    Raises:
        OptionError: naming the key, the expected type or the valid values.
    """
    if spec.types is not ANY:
        allowed = spec.types if isinstance(spec.types, tuple) else (spec.types,)
        if float in allowed:
            allowed = (*allowed, int)
        ok = isinstance(value, allowed) and not (isinstance(value, bool) and bool not in allowed)
        if not ok:
            raise OptionError(f"option '{dotted}' must be {_type_name(spec.types)}, got {type(value).__name__} "
                              f"{value!r}")
    if spec.choices is not None and value not in spec.choices:
        valid = ", ".join(repr(c) for c in spec.choices)
        raise OptionError(f"option '{dotted}' = {value!r} is not one of {valid}")
    why = spec.refuse(value) if spec.refuse is not None else None
    if why:
        raise OptionError(f"option '{dotted}' = {value!r}: {why}")


def unknown_key_error(dotted: str, known: Iterable[str], siblings: Mapping[str, str] | None = None,
                      elsewhere: Mapping[str, str] | None = None) -> OptionError:
    """The one-line error for a key that is not in ``known``.

    The suggestion prefers a key of ``known`` (the section's own keys): a close key that only a sibling section
    reads would be accepted without effect, so it is named as such, never offered as the fix. A key that another
    (non-sibling) section reads gets no suggestion: the user meant the key they wrote, in the wrong section.

    Args:
        dotted: the key as written, with its section (``datasets.train.filename_tmp``).
        known: the keys the section reads.
        siblings: ``{key: reader}`` of the keys sibling sections read (accepted here without effect).
        elsewhere: ``{key: reader}`` of the keys other, non-sibling sections read.
    """
    known = sorted(known)
    leaf = dotted.rpartition(".")[2]
    if elsewhere and leaf in elsewhere:
        return OptionError(f"unknown option '{dotted}': {elsewhere[leaf]} reads it; this dataset type and its "
                           "family do not")
    own = difflib.get_close_matches(leaf, known, n=1, cutoff=0.5)
    near = difflib.get_close_matches(leaf, sorted(siblings or ()), n=1, cutoff=0.5)
    if near and (not own or _closeness(leaf, near[0]) > _closeness(leaf, own[0])):
        reader = (siblings or {})[near[0]]
        hint = (f"; did you mean '{own[0]}'? ('{near[0]}', closer, is read by {reader}: no effect here)" if own
                else f"; did you mean '{near[0]}'? (read by {reader}; no effect here)")
    else:
        hint = f"; did you mean '{own[0]}'?" if own else f"; known keys here: {', '.join(known)}"
    return OptionError(f"unknown option '{dotted}'{hint}")


def _closeness(a: str, b: str) -> float:
    return difflib.SequenceMatcher(None, a, b).ratio()


def resolve_section(values: dict[str, Any], spec: dict[str, Opt], where: str,
                    family: Mapping[str, str] | None = None, elsewhere: Mapping[str, str] | None = None,
                    notes: list[str] | None = None) -> dict[str, Any]:
    """Check a section against its spec and fill its defaults (a new dict; ``values`` is not modified).

    Args:
        values: the section as written.
        spec: ``{key: Opt}`` of the section.
        where: the dotted name of the section, for the messages (e.g. ``datasets.train``).
        family: ``{key: reader}`` of the keys that sibling sections read (the other dataset types of its family):
            such a key is accepted with one note and left out of the result, as KAIR's files carry their
            siblings' keys.
        elsewhere: ``{key: reader}`` of the keys that other, non-sibling sections read (still errors, named so).
        notes: where the notes go (the caller logs them once logging is set up); ``None``: logged now.

    Raises:
        OptionError: unknown key (with the closest known one), wrong type, invalid value, missing required key.
    """
    out = copy.deepcopy(values)
    for key, value in values.items():
        if key not in spec and family and key in family:
            note = (f"option '{where}.{key}' has no effect for this dataset type ({family[key]} reads it); accepted "
                    "as KAIR's option files carry it")
            if notes is None:
                logger.info("%s", note)
            else:
                notes.append(note)
            del out[key]
            continue
        if key not in spec:
            raise unknown_key_error(f"{where}.{key}", spec, family, elsewhere)
        check_value(f"{where}.{key}", value, spec[key])
    for key, opt in spec.items():
        if key in out:
            continue
        if opt.default is REQUIRED:
            raise OptionError(f"option '{where}.{key}' is required ({opt.doc})")
        if opt.default is not OPTIONAL:
            out[key] = copy.deepcopy(opt.default)
    return out


def _children(prefix: str) -> dict[str, Opt]:
    """The schema entries directly under ``prefix`` (``''`` for the top level), by leaf name."""
    out = {}
    for key, opt in SCHEMA.items():
        parent, _, leaf = key.rpartition(".")
        if parent == prefix:
            out[leaf] = opt
    return out


def _validate(tree: dict[str, Any], prefix: str = "") -> None:
    children = _children(prefix)
    for key, value in tree.items():
        dotted = f"{prefix}.{key}" if prefix else key
        if key not in children:
            raise unknown_key_error(dotted, children)
        check_value(dotted, value, children[key])
        if isinstance(value, dict) and dotted not in ("netG", "netE", "datasets"):
            _validate(value, dotted)


def _set_dotted(tree: dict[str, Any], dotted: str, value: Any) -> None:
    parts = dotted.split(".")
    node = tree
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise OptionError(f"--set {dotted}: '{part}' is not an object in the option file")
        node = child
    node[parts[-1]] = value


def apply_overrides(tree: dict[str, Any], overrides: Iterable[str]) -> None:
    """Apply ``KEY=VALUE`` overrides with dotted keys; values parse as JSON, else as strings."""
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise OptionError(f"--set expects KEY=VALUE with a dotted key (e.g. train.total_iter=10), got {item!r}")
        try:
            value = json.loads(raw)
        except json.JSONDecodeError:
            value = raw
        _set_dotted(tree, key.strip(), value)


def _fill_defaults(tree: dict[str, Any], prefix: str = "") -> None:
    for key, opt in _children(prefix).items():
        dotted = f"{prefix}.{key}" if prefix else key
        if key not in tree:
            if opt.default is REQUIRED:
                raise OptionError(f"option '{dotted}' is required ({opt.doc})")
            if opt.default is OPTIONAL:
                continue
            tree[key] = copy.deepcopy(opt.default)
        if isinstance(tree[key], dict) and dotted not in ("netG", "netE", "datasets"):
            _fill_defaults(tree[key], dotted)


def kair_notes(tree: dict[str, Any], prefix: str = "") -> list[str]:
    """``'key: why'`` for each informational KAIR key the file sets (accepted, without effect here)."""
    notes = []
    for key, value in tree.items():
        dotted = f"{prefix}.{key}" if prefix else key
        opt = SCHEMA.get(dotted)
        if opt is not None and opt.note:
            notes.append(f"{dotted} ({opt.note})")
        if isinstance(value, dict) and opt is not None and dotted not in ("netG", "netE", "datasets"):
            notes.extend(kair_notes(value, dotted))
    return notes


def _expand(path: Any) -> Any:
    return os.path.expanduser(path) if isinstance(path, str) and path else path


def _resolve(opt: dict[str, Any], opt_path: str | None, is_train: bool, dataset_specs: Specs | None,
             net_specs: Specs | None, families: Iterable[Collection[str]], notes: list[str] | None) -> None:
    opt["opt_path"] = opt_path
    opt["is_train"] = is_train
    opt["num_gpu"] = utils_dist.world_info_from_env()[2]  # informational: the job's WORLD_SIZE
    path = opt["path"]
    for key, value in list(path.items()):
        path[key] = _expand(value)
    task_dir = os.path.join(path["root"], opt["task"])
    path.update(task=task_dir, log=task_dir, options=os.path.join(task_dir, "options"),
                models=os.path.join(task_dir, "models"), tensorboard=os.path.join(task_dir, "tensorboard"),
                images=os.path.join(task_dir, "images" if is_train else "test_images"))
    for phase_key, dataset in opt["datasets"].items():
        phase = phase_key.split("_")[0]
        if phase not in ("train", "test"):
            raise OptionError(f"datasets.{phase_key}: the phase must be 'train' or 'test' (a key starting with "
                              "'train' or 'test')")
        dataset["phase"] = phase
        dataset.setdefault("scale", opt["scale"])
        dataset.setdefault("n_channels", opt["n_channels"])
        if dataset_specs is not None:
            dataset = opt["datasets"][phase_key] = _resolve_dataset(dataset, dataset_specs, f"datasets.{phase_key}",
                                                                    families, notes)
        for key in DATASET_PATH_KEYS:
            if key in dataset:
                dataset[key] = _expand(dataset[key])
    train = opt["train"]
    if train.get("G_scheduler_periods") is None:
        train["G_scheduler_periods"] = train["total_iter"]
    for key in ("total_iter", "checkpoint_save", "checkpoint_print", "checkpoint_test"):
        if train[key] < 1 and not (key == "checkpoint_test" and train[key] == 0):
            raise OptionError(f"option 'train.{key}' must be >= 1, got {train[key]}")
    netg = opt.get("netG")
    if not isinstance(netg, dict) or "net_type" not in netg:
        raise OptionError("option 'netG' must be an object with a 'net_type' (e.g. \"vrt\" or \"rvrt\")")
    if net_specs is not None:
        check_network(netg, net_specs)


def _resolve_dataset(dataset: dict[str, Any], specs: Specs, where: str, families: Iterable[Collection[str]],
                     notes: list[str] | None) -> dict[str, Any]:
    kind = str(dataset.get("dataset_type", "")).lower()
    if kind not in specs:
        raise OptionError(f"option '{where}.dataset_type' = {dataset.get('dataset_type')!r} is unknown; registered: "
                          f"{', '.join(sorted(specs))}")
    siblings, others = foreign_keys(specs, kind, next((f for f in families if kind in f), ()))
    return resolve_section(dataset, {**DATASET_COMMON, **specs[kind]}, where, siblings, others, notes)


def foreign_keys(specs: Specs, kind: str, family: Collection[str]) -> tuple[dict[str, str], dict[str, str]]:
    """The keys that ``kind`` does not read but other dataset types do, as two ``{key: dataset type}`` dicts:
    those read by a type of ``kind``'s ``family`` (accepted without effect), and the others (errors)."""
    siblings = family_keys(specs, kind, family)
    return siblings, {k: v for k, v in family_keys(specs, kind, specs).items() if k not in siblings}


def family_keys(specs: Specs, kind: str, members: Collection[str]) -> dict[str, str]:
    """``{key: dataset type}`` of the keys that the other dataset types of ``members`` read and ``kind`` does not
    (``members``: ``kind``'s family for the keys accepted without effect; every type for the keys known at all)."""
    own = specs.get(kind, {})
    found: dict[str, str] = {}
    for other, spec in sorted(specs.items()):
        if other == kind or other not in members:
            continue
        for key in spec:
            if key not in own:
                found.setdefault(key, other)
    return found


def check_network(netg: dict[str, Any], specs: Specs) -> None:
    """Check ``netG`` against the constructor of its ``net_type`` (names and types; defaults stay the
    constructor's).

    Raises:
        OptionError: unknown ``net_type``, unknown argument (with the closest one) or a wrong type.
    """
    kind = str(netg["net_type"]).lower()
    if kind not in specs:
        raise OptionError(f"option 'netG.net_type' = {netg['net_type']!r} is unknown; registered: "
                          f"{', '.join(sorted(specs))}")
    spec = {**NETWORK_META, **specs[kind]}
    for key, value in netg.items():
        if key not in spec:
            raise unknown_key_error(f"netG.{key}", spec)
        check_value(f"netG.{key}", value, spec[key])


def parse(opt_path: str | None, overrides: Iterable[str] = (), is_train: bool = True,
          base: dict[str, Any] | None = None, dataset_specs: Specs | None = None,
          net_specs: Specs | None = None, dataset_families: Iterable[Collection[str]] = (),
          notes: list[str] | None = None) -> dict[str, Any]:
    """Load, override, validate and resolve an option file.

    Args:
        opt_path: the JSON file (KAIR format); ``None`` to start from ``base`` alone.
        overrides: ``KEY=VALUE`` strings with dotted keys (``train.total_iter=10``).
        is_train: training (``images/``) or testing (``test_images/``) layout.
        base: an already loaded option dict (used instead of reading ``opt_path``).
        dataset_specs: ``{dataset_type: {key: Opt}}``; each dataset section is checked and completed with the
            spec of its type (the training and evaluation flows pass the registry's; without it dataset sections
            are only given ``phase``, ``scale`` and ``n_channels``).
        net_specs: ``{net_type: {key: Opt}}`` built from the network constructors; ``netG`` is checked against it.
        dataset_families: sets of dataset types whose option files carry each other's keys (KAIR's): a key that
            another type of a section's family reads is accepted there without effect; any other foreign key is an
            error.
        notes: collects those acceptances as log lines, for the caller to log once its logger is set up (parsing
            comes first); ``None``: logged at once.

    Returns:
        A plain nested dict with defaults filled and paths resolved. Treat it as read-only.

    Raises:
        OptionError: unreadable file, malformed JSON, unknown key, wrong type or invalid value.
    """
    tree = copy.deepcopy(base) if base is not None else load_json(opt_path or "")
    apply_overrides(tree, overrides)
    _validate(tree)
    _fill_defaults(tree)
    _resolve(tree, opt_path, is_train, dataset_specs, net_specs, [set(f) for f in dataset_families], notes)
    return tree


@utils_dist.master_only
def save(opt: dict[str, Any], argv: list[str] | None = None) -> str:
    """Write the resolved options (plus the command line) to ``path.options`` (rank 0 only).

    Returns:
        The written file's path.
    """
    os.makedirs(opt["path"]["options"], exist_ok=True)
    base = os.path.splitext(os.path.basename(opt.get("opt_path") or "options.json"))[0]
    stem = os.path.join(opt["path"]["options"], f"{base}_{time.strftime('%y%m%d_%H%M%S')}")
    dest, n = f"{stem}.json", 1
    while os.path.exists(dest):  # never overwrite an earlier run's copy
        dest, n = f"{stem}_{n}.json", n + 1
    payload = dict(opt, command_line=" ".join(argv if argv is not None else sys.argv))
    with atomic_open(dest, "w", encoding="utf-8") as f:
        json.dump(payload, f, indent=2)
    return dest


def dict2str(opt: dict[str, Any], indent: int = 1) -> str:
    """Render options as KAIR's indented ``key: value`` text for the log."""
    lines = []
    for key, value in opt.items():
        if isinstance(value, dict):
            lines.append(" " * (indent * 2) + f"{key}:[")
            lines.append(dict2str(value, indent + 1))
            lines.append(" " * (indent * 2) + "]")
        else:
            lines.append(" " * (indent * 2) + f"{key}: {value}")
    return "\n".join(lines)
