"""Option files: parse, validate, override and save KAIR-format JSON experiment files.

A KAIR option file loads unchanged: ``//`` comments (outside strings, so ``"http://..."`` survives), every key
KAIR's VRT/RVRT files use, KAIR's defaults where they still mean something. Unlike KAIR, an unknown or misspelt
key is an error naming the closest known key, a wrong type is an error naming the expected type, and parsing
has no side effects (no ``CUDA_VISIBLE_DEVICES`` write, no print, no mkdir). ``netG`` and ``datasets.*`` are
free-form: ``netG`` keys go to the network constructor, which is their schema.
"""

from __future__ import annotations

import copy
import difflib
import json
import logging
import os
import sys
import time
from collections.abc import Iterable
from typing import Any

from utils import utils_dist

logger = logging.getLogger(__name__)

ANY = object()  # type marker: any JSON value
NUM = (int, float)
OPT_STR = (str, type(None))
OPT_NUM = (int, float, type(None))
OPT_INT = (int, type(None))

# Schema: dotted key -> (accepted types, default). A default of ANY means "no default, key optional".
# Sections marked FREE are dicts whose own keys are not checked here.
FREE = "free-form"
SCHEMA: dict[str, tuple[Any, Any]] = {
    "task": (str, "vrt_experiment"),
    "model": (str, "vrt"),
    "gpu_ids": ((list, str), "auto"),
    "dist": ((bool, str), False),
    "find_unused_parameters": (bool, False),
    "use_static_graph": (bool, False),
    "scale": (int, 1),
    "n_channels": (int, 3),
    "merge_bn": (bool, False),
    "merge_bn_startpoint": (int, -1),
    "dist_backend": (OPT_STR, None),
    "dist_timeout": (NUM, 1800),
    "sync_bn": (bool, False),
    # informational keys that KAIR writes into its saved copies of an option file
    "opt_path": (OPT_STR, ANY),
    "is_train": (bool, ANY),
    "num_gpu": ((int, str), ANY),
    "rank": (int, ANY),
    "world_size": (int, ANY),
    "command_line": (str, ANY),
    "path": (dict, {}),
    "path.root": (str, "experiments"),
    "path.pretrained_netG": (OPT_STR, None),
    "path.pretrained_netE": (OPT_STR, None),
    "path.pretrained_optimizerG": (OPT_STR, None),
    "path.task": (OPT_STR, ANY),
    "path.log": (OPT_STR, ANY),
    "path.options": (OPT_STR, ANY),
    "path.models": (OPT_STR, ANY),
    "path.images": (OPT_STR, ANY),
    "path.tensorboard": (OPT_STR, ANY),
    "datasets": (dict, {}),
    "datasets.*": (dict, FREE),
    "netG": (dict, FREE),
    "netE": (dict, FREE),
    "train": (dict, {}),
    "train.G_lossfn_type": (str, "charbonnier"),
    "train.G_lossfn_weight": (NUM, 1.0),
    "train.G_charbonnier_eps": (NUM, 1e-9),
    "train.E_decay": (NUM, 0),
    "train.E_param_strict": (bool, True),
    "train.G_param_strict": (bool, True),
    "train.G_optimizer_type": (str, "adam"),
    "train.G_optimizer_lr": (NUM, 2e-4),
    "train.G_optimizer_betas": (list, [0.9, 0.999]),
    "train.G_optimizer_wd": (NUM, 0),
    "train.G_optimizer_clipgrad": (OPT_NUM, None),
    "train.G_optimizer_reuse": (bool, False),
    "train.fix_iter": (int, 0),
    "train.fix_lr_mul": (NUM, 1.0),
    "train.fix_keys": (list, []),
    "train.total_iter": (int, 300000),
    "train.G_scheduler_type": (str, "CosineAnnealingWarmRestarts"),
    "train.G_scheduler_periods": (OPT_INT, None),
    "train.G_scheduler_eta_min": (NUM, 0),
    "train.G_scheduler_milestones": (list, []),
    "train.G_scheduler_gamma": (NUM, 0.5),
    "train.G_scheduler_restart_weights": (NUM, 1),
    "train.G_regularizer_orthstep": (OPT_INT, None),
    "train.G_regularizer_clipstep": (OPT_INT, None),
    "train.checkpoint_test": (int, 5000),
    "train.checkpoint_save": (int, 5000),
    "train.checkpoint_print": (int, 200),
    "train.manual_seed": (OPT_INT, None),
    "train.F_feature_layer": (ANY, ANY),
    "train.F_weights": (ANY, ANY),
    "train.F_lossfn_type": (ANY, ANY),
    "train.F_use_input_norm": (ANY, ANY),
    "train.F_use_range_norm": (ANY, ANY),
    # keys added by this framework
    "train.amp": (str, "none"),
    "train.grad_accum_steps": (int, 1),
    "train.compile": (bool, False),
    "train.deterministic": (bool, True),
    "train.tf32": (bool, False),
    "train.dataloader_timeout": (NUM, 0),
    "train.stop_on_nonfinite": (bool, True),
    "val": (dict, {}),
    "val.save_img": (bool, False),
    "val.pad_seq": (bool, False),
    "val.flip_seq": (bool, False),
    "val.center_frame_only": (bool, False),
    "val.num_frame_testing": (int, 0),
    "val.num_frame_overlapping": (int, 2),
    "val.size_patch_testing": (int, 0),
    "val.overlap_size": (int, 20),
    "val.tb_images": (bool, True),
}
CHOICES = {
    "train.amp": ("none", "bf16", "fp16"),
    "train.G_lossfn_type": ("l1", "l2", "l2sum", "ssim", "charbonnier"),
    "train.G_optimizer_type": ("adam", "adamw"),
    "train.G_scheduler_type": ("CosineAnnealingWarmRestarts", "MultiStepLR"),
    "dist_backend": (None, "nccl", "gloo"),
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


def _schema_key(dotted: str) -> str | None:
    if dotted in SCHEMA:
        return dotted
    head, _, _ = dotted.partition(".")
    if head == "datasets" and dotted.count(".") >= 1:
        return "datasets.*" if dotted.count(".") == 1 else None
    return None


def _in_free_section(dotted: str) -> bool:
    parts = dotted.split(".")
    return parts[0] in ("netG", "netE") and len(parts) > 1 or parts[0] == "datasets" and len(parts) > 2


def _type_name(types: Any) -> str:
    types = types if isinstance(types, tuple) else (types,)
    names = {int: "integer", float: "number", str: "string", bool: "boolean", list: "list", dict: "object",
             type(None): "null"}
    return " or ".join(dict.fromkeys(names.get(t, t.__name__) for t in types))


def _check_type(dotted: str, value: Any, types: Any) -> None:
    if types is ANY:
        return
    allowed = types if isinstance(types, tuple) else (types,)
    ok = isinstance(value, allowed) and not (isinstance(value, bool) and bool not in allowed)
    if not ok:
        raise OptionError(f"option '{dotted}' must be {_type_name(types)}, got {type(value).__name__} {value!r}")
    choices = CHOICES.get(dotted)
    if choices is not None and value not in choices:
        valid = ", ".join(repr(c) for c in choices)
        raise OptionError(f"option '{dotted}' = {value!r} is not one of {valid}")


def _known_siblings(prefix: str) -> list[str]:
    leaves = []
    for key in SCHEMA:
        parent, _, leaf = key.rpartition(".")
        if parent == prefix and leaf != "*":
            leaves.append(leaf)
    return leaves


def _validate(tree: dict[str, Any], prefix: str = "") -> None:
    for key, value in tree.items():
        dotted = f"{prefix}.{key}" if prefix else key
        if _in_free_section(dotted):
            continue
        skey = _schema_key(dotted)
        if skey is None:
            known = _known_siblings(prefix)
            close = difflib.get_close_matches(key, known, n=1, cutoff=0.5)
            hint = f"; did you mean '{close[0]}'?" if close else f"; known keys here: {', '.join(sorted(known))}"
            raise OptionError(f"unknown option '{dotted}'{hint}")
        types, default = SCHEMA[skey]
        _check_type(dotted, value, types)
        if isinstance(value, dict) and default is not FREE or skey == "datasets.*":
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


def _fill_defaults(tree: dict[str, Any]) -> None:
    for skey, (_, default) in SCHEMA.items():
        if default is ANY or default is FREE or "*" in skey:
            continue
        parent, _, leaf = skey.rpartition(".")
        node = tree if not parent else tree.get(parent)
        if isinstance(node, dict) and leaf not in node:
            node[leaf] = copy.deepcopy(default)


def _expand(path: Any) -> Any:
    return os.path.expanduser(path) if isinstance(path, str) and path else path


def _resolve(opt: dict[str, Any], opt_path: str | None, is_train: bool) -> None:
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
        for key in DATASET_PATH_KEYS:
            if key in dataset:
                dataset[key] = _expand(dataset[key])
    train = opt["train"]
    if train.get("G_scheduler_periods") is None:
        train["G_scheduler_periods"] = train["total_iter"]
    for key in ("total_iter", "checkpoint_save", "checkpoint_print", "checkpoint_test", "grad_accum_steps"):
        if train[key] < 1 and not (key == "checkpoint_test" and train[key] == 0):
            raise OptionError(f"option 'train.{key}' must be >= 1, got {train[key]}")
    netg = opt.get("netG")
    if not isinstance(netg, dict) or "net_type" not in netg:
        raise OptionError("option 'netG' must be an object with a 'net_type' (e.g. \"vrt\" or \"rvrt\")")


def parse(opt_path: str | None, overrides: Iterable[str] = (), is_train: bool = True,
          base: dict[str, Any] | None = None) -> dict[str, Any]:
    """Load, override, validate and resolve an option file.

    Args:
        opt_path: the JSON file (KAIR format); ``None`` to start from ``base`` alone.
        overrides: ``KEY=VALUE`` strings with dotted keys (``train.total_iter=10``).
        is_train: training (``images/``) or testing (``test_images/``) layout.
        base: an already loaded option dict (used instead of reading ``opt_path``).

    Returns:
        A plain nested dict with defaults filled and paths resolved. Treat it as read-only.

    Raises:
        OptionError: unreadable file, malformed JSON, unknown key, wrong type or invalid value.
    """
    tree = copy.deepcopy(base) if base is not None else load_json(opt_path or "")
    apply_overrides(tree, overrides)
    _validate(tree)
    _fill_defaults(tree)
    _resolve(tree, opt_path, is_train)
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
    tmp = dest + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(payload, f, indent=2)
    os.replace(tmp, dest)
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
