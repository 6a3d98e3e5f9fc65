"""Dataset option schema: every dataset class declares its keys (type, default, doc) in ``OPTIONS``; option files
and direct construction are checked against ``{**DATASET_COMMON, **cls.OPTIONS}``; no default is written twice."""

from __future__ import annotations

import ast
import copy
import glob
import logging
import os

import pytest

from data import dataset_options
from data.dataset_options import resolve_options, spec_of
from data.dataset_video_test import VideoRecurrentTestDataset
from data.dataset_video_train import (
    VideoRecurrentTrainDataset,
    VideoRecurrentTrainNonblindDenoisingDataset,
    VideoRecurrentTrainVimeoDataset,
)
from data.select_dataset import DATASETS, define_Dataset, option_specs
from tests.support.helpers import ROOT
from utils.utils_option import OptionError, check_value, parse
from utils.utils_option_schema import OPTIONAL, REQUIRED

OPTION_FILES = sorted(glob.glob(os.path.join(ROOT, "options", "vrt", "*.json"))
                      + glob.glob(os.path.join(ROOT, "options", "rvrt", "*.json")))
V01 = os.path.join(ROOT, "options", "vrt", "001_train_vrt_videosr_bi_reds_6frames.json")
V03 = os.path.join(ROOT, "options", "vrt", "003_train_vrt_videosr_bi_vimeo_7frames.json")
V08 = os.path.join(ROOT, "options", "vrt", "008_train_vrt_videodenoising_davis.json")
DATA_DIR = os.path.join(ROOT, "data")


def _parse(path: str, *overrides: str) -> dict:
    return parse(path, overrides=overrides, dataset_specs=option_specs(),
                 dataset_families=dataset_options.DATASET_FAMILIES.values())


def _defaults(spec: dict) -> dict:
    return {k: o.default for k, o in spec.items() if o.default is not REQUIRED and o.default is not OPTIONAL}


# ---------------------------------------------------------------- option files
def test_option_files_are_all_found():
    assert len(OPTION_FILES) == 21  # the demos (denoising, real-world), V01-V09, R01-R06, real-world V10 and R07


@pytest.mark.parametrize("path", OPTION_FILES, ids=os.path.basename)
def test_every_shipped_option_file_parses_and_fills_dataset_defaults(path):
    written = parse(path)["datasets"]  # without the specs: the sections as written (plus phase/scale/n_channels)
    opt = _parse(path)
    assert set(opt["datasets"]) == set(written)
    for key, section in opt["datasets"].items():
        cls = DATASETS[section["dataset_type"].lower()]
        spec = spec_of(cls)
        for name, default in _defaults(spec).items():  # every default is filled in ...
            assert section[name] == written[key].get(name, default), f"{key}.{name}"
        assert {k: section[k] for k in written[key]} == written[key]  # ... and nothing written is changed
        assert set(section) <= set(spec)
        assert resolve_options(cls, section) == section  # the class accepts what the parser produced, unchanged


def test_parsed_sections_hold_the_class_defaults():
    v01 = _parse(V01)["datasets"]
    assert v01["train"]["check_data"] is True and v01["train"]["check_decode_samples"] == 64
    assert v01["train"]["dataroot_flow"] is None and v01["train"]["val_partition"] == "REDS4"
    assert v01["test"]["sigma"] == 0 and v01["test"]["noise_seed"] == 0 and v01["test"]["cache_data"] is True
    v03 = _parse(V03)["datasets"]["train"]
    assert v03["temporal_scale"] == 1 and v03["mirror_sequence"] is False and v03["pad_sequence"] is True
    v08 = _parse(V08)["datasets"]["train"]
    assert v08["sigma_min"] == 0 and v08["sigma_max"] == 50 and v08["scale"] == 1


# ---------------------------------------------------------------- errors through the parser
def test_misspelt_key_names_the_section_and_the_closest_key():
    with pytest.raises(OptionError) as err:
        _parse(V01, "datasets.train.dataloader_batch_sze=3")
    msg = str(err.value)
    assert "'datasets.train.dataloader_batch_sze'" in msg and "did you mean 'dataloader_batch_size'" in msg
    with pytest.raises(OptionError, match=r"'datasets\.test\.cach_data'; did you mean 'cache_data'"):
        _parse(V01, "datasets.test.cach_data=false")
    # a Vimeo key on a REDS set is a sibling's key: accepted without effect (tests/test_kair_options.py)
    assert "pad_sequence" not in _parse(V01, "datasets.train.pad_sequence=true")["datasets"]["train"]


def test_wrong_type_names_the_expected_type():
    with pytest.raises(OptionError, match=r"'datasets\.train\.gt_size' must be integer, got str 'big'"):
        _parse(V01, "datasets.train.gt_size=big")
    with pytest.raises(OptionError, match=r"'datasets\.test\.cache_data' must be boolean, got int 1"):
        _parse(V01, "datasets.test.cache_data=1")
    with pytest.raises(OptionError, match=r"'datasets\.train\.sigma_max' must be integer or number"):
        _parse(V08, 'datasets.train.sigma_max="50"')


def test_unknown_dataset_type_lists_the_registered_ones():
    with pytest.raises(OptionError) as err:
        _parse(V01, "datasets.train.dataset_type=VideoRecurrentTrainDatset")
    msg = str(err.value)
    assert "'datasets.train.dataset_type' = 'VideoRecurrentTrainDatset' is unknown" in msg
    assert all(name in msg for name in DATASETS)


def test_refused_values_give_their_reason():
    with pytest.raises(OptionError, match=r"'datasets\.test\.io_backend' = \{'type': 'lmdb'\}: test clips are read "
                                          "from frame folders"):
        _parse(V01, 'datasets.test.io_backend={"type": "lmdb"}')
    with pytest.raises(OptionError, match=r"'datasets\.test\.num_frame' = 5: a test item is a whole clip"):
        _parse(V01, "datasets.test.num_frame=5")
    with pytest.raises(OptionError, match=r"'datasets\.train\.interval_list' = \[1, 2\]: Vimeo septuplets"):
        _parse(V03, "datasets.train.interval_list=[1,2]")
    with pytest.raises(OptionError, match=r"'datasets\.train\.io_backend' = \{'type': 'memcached'\}: must be"):
        _parse(V01, 'datasets.train.io_backend={"type": "memcached"}')
    with pytest.raises(OptionError, match=r"'datasets\.train\.dataroot_flow' = 'flow\.lmdb': VRT/RVRT estimate"):
        _parse(V01, "datasets.train.dataroot_flow=flow.lmdb")
    with pytest.raises(OptionError, match=r"'datasets\.train\.scale' = 4: denoising restores at the input size"):
        _parse(V08, "datasets.train.scale=4")
    with pytest.raises(OptionError, match=r"'datasets\.train\.n_channels' = 1: frames are read as 3-channel RGB"):
        _parse(V01, "n_channels=1")  # the top-level value reaches every dataset section
    with pytest.raises(OptionError, match=r"'datasets\.train\.val_partition' = 'REDS5': use one of"):
        _parse(V01, "datasets.train.val_partition=REDS5")
    with pytest.raises(OptionError, match=r"'datasets\.train\.gt_size' = 0: must be >= 1"):
        _parse(V01, "datasets.train.gt_size=0")


def test_required_key_is_named():
    with pytest.raises(OptionError, match=r"'datasets\.train\.meta_info_file' is required \(Clip list"):
        parse(V01, dataset_specs=option_specs(), base=_without(V01, "meta_info_file"))


def _without(path: str, key: str) -> dict:
    from utils.utils_option import load_json

    opt = load_json(path)
    del opt["datasets"]["train"][key]
    return opt


# ---------------------------------------------------------------- direct construction
@pytest.mark.parametrize("name", sorted(DATASETS))
def test_direct_construction_checks_keys_before_touching_files(name):
    cls = DATASETS[name]
    opt = {"dataloader_batch_sze": 3}
    with pytest.raises(OptionError) as err:
        cls(opt)
    msg = str(err.value)
    assert f"'{cls.__name__}.dataloader_batch_sze'" in msg and "did you mean 'dataloader_batch_size'" in msg
    assert opt == {"dataloader_batch_sze": 3}
    with pytest.raises(OptionError, match=f"unknown option '{cls.__name__}.cache_dat'"):  # through the registry
        define_Dataset({"dataset_type": cls.__name__, "cache_dat": True})


def test_direct_construction_wrong_type_and_refusal():
    with pytest.raises(OptionError, match=r"'VideoRecurrentTrainDataset\.num_frame' must be integer, got str"):
        VideoRecurrentTrainDataset({"dataroot_gt": "g", "dataroot_lq": "l", "meta_info_file": "m", "num_frame": "6"})
    with pytest.raises(OptionError, match=r"'VideoRecurrentTrainDataset\.num_frame' is required"):
        VideoRecurrentTrainDataset({"dataroot_gt": "g", "dataroot_lq": "l", "meta_info_file": "m"})
    with pytest.raises(OptionError, match=r"'VideoRecurrentTestDataset\.io_backend' = \{'type': 'lmdb'\}"):
        VideoRecurrentTestDataset({"dataroot_gt": "g", "dataroot_lq": "l", "io_backend": {"type": "lmdb"}})
    with pytest.raises(OptionError, match=r"'VideoRecurrentTestDataset\.dataroot_lq' is required when sigma is 0"):
        VideoRecurrentTestDataset({"dataroot_gt": "g"})
    with pytest.raises(OptionError, match=r"'VideoRecurrentTrainVimeoDataset\.num_frame' = 9: a Vimeo septuplet"):
        VideoRecurrentTrainVimeoDataset({"dataroot_gt": "g", "dataroot_lq": "l", "meta_info_file": "m",
                                         "num_frame": 9})


def test_resolve_options_copies_fills_and_logs_notes(caplog):
    opt = {"dataroot_gt": "gt.lmdb", "dataroot_lq": "gt.lmdb", "meta_info_file": "m", "num_frame": 6,
           "io_backend": {"type": "lmdb"}}
    frozen = copy.deepcopy(opt)
    with caplog.at_level(logging.INFO, logger="data.dataset_options"):
        out = resolve_options(VideoRecurrentTrainNonblindDenoisingDataset, opt)
    assert "option 'dataroot_lq' has no effect: the noisy input is synthesised" in caplog.text
    out["io_backend"]["type"] = "disk"
    assert opt == frozen  # a deep copy: the caller's dict (nested ones included) is never touched
    assert out["dataset_type"] == "VideoRecurrentTrainNonblindDenoisingDataset"  # built directly: its own type
    assert out["sigma_max"] == 50 and out["scale"] == 1 and out["use_rot"] is True
    assert "phase" not in out and "n_channels" not in out  # OPTIONAL keys are not invented


# ---------------------------------------------------------------- the specs themselves
def test_specs_are_complete_and_consistent():
    specs = option_specs()
    assert set(specs) == set(DATASETS)
    for name, cls in DATASETS.items():
        assert specs[name] is cls.OPTIONS
        for base in cls.__mro__[1:]:  # a subclass extends its parent's keys
            if "OPTIONS" in vars(base):
                assert set(base.OPTIONS) <= set(cls.OPTIONS), f"{cls.__name__} drops keys of {base.__name__}"
        for key, opt in spec_of(cls).items():
            assert opt.doc.strip() and opt.doc.rstrip().endswith((".", ")")), f"{cls.__name__}.{key}: doc"
            if opt.default is not REQUIRED and opt.default is not OPTIONAL:
                check_value(f"{cls.__name__}.{key}", opt.default, opt)  # a default passes its own checks


# ---------------------------------------------------------------- guards on the code in data/
def _is_opt(node: ast.AST) -> bool:
    return isinstance(node, ast.Name) and node.id == "opt" or isinstance(node, ast.Attribute) and node.attr == "opt"


def _is_key(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, str)


def literal_defaults(source: str) -> list[str]:
    """Defaults written in code: ``.get("key", default)``, ``.get("key") or default``, ``.setdefault("key", ...)``
    and helpers called as ``helper(opt, "key", <literal>, ...)``."""
    literal = (ast.Constant, ast.List, ast.Dict, ast.Tuple)
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            keyed = node.args and _is_key(node.args[0])
            if keyed and node.func.attr == "setdefault" or keyed and node.func.attr == "get" and len(node.args) > 1:
                found.append(f"line {node.lineno}: {ast.unparse(node)}")
        if (isinstance(node, ast.Call) and len(node.args) > 2 and _is_opt(node.args[0]) and _is_key(node.args[1])
                and isinstance(node.args[2], literal)):
            found.append(f"line {node.lineno}: {ast.unparse(node)}")
        if isinstance(node, ast.BoolOp) and isinstance(node.op, ast.Or):
            first = node.values[0]
            if (isinstance(first, ast.Call) and isinstance(first.func, ast.Attribute) and first.func.attr == "get"
                    and any(isinstance(v, (ast.Constant, ast.List, ast.Dict, ast.Tuple)) for v in node.values[1:])):
                found.append(f"line {node.lineno}: {ast.unparse(node)}")
    return found


def option_reads(source: str) -> set[str]:
    """String keys read from a name or attribute called ``opt`` (``opt["k"]``, ``self.opt["k"]``, ``opt.get("k")``)."""
    keys = set()
    for node in ast.walk(ast.parse(source)):
        target, key = None, None
        if isinstance(node, ast.Subscript):
            target, key = node.value, node.slice
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get":
            target, key = node.func.value, node.args[0] if node.args else None
        if target is not None and key is not None and _is_opt(target) and _is_key(key):
            keys.add(key.value)
    return keys


def _data_sources() -> dict[str, str]:
    return {path: open(path, encoding="utf-8").read() for path in sorted(glob.glob(os.path.join(DATA_DIR, "*.py")))}


def test_the_guards_see_what_they_look_for():
    bad = ('def f(opt, self):\n    a = opt.get("gt_size", 256)\n    b = self.opt.get("sigma") or 0\n'
           '    opt.setdefault("scale", 4)\n    c = store.get(key)\n    d = opt["num_frame"]\n'
           '    e = self.opt["sigma_max"]\n    g = _get(opt, "seed", 0, int)\n    h = _get(opt, "seed")\n')
    assert len(literal_defaults(bad)) == 4
    assert option_reads(bad) == {"gt_size", "sigma", "num_frame", "sigma_max"}


def test_no_literal_defaults_in_data():
    offenders = [f"{os.path.relpath(p, ROOT)} {hit}" for p, src in _data_sources().items()
                 for hit in literal_defaults(src)]
    assert not offenders, "defaults belong in the OPTIONS entries:\n" + "\n".join(offenders)


def test_every_key_the_datasets_read_is_declared():
    declared = set().union(*(spec_of(cls) for cls in DATASETS.values()))
    read = set().union(*(option_reads(src) for src in _data_sources().values()))
    assert read, "the scan found no option read at all"
    assert read <= declared, f"read but declared by no dataset: {sorted(read - declared)}"


def test_shared_options_are_the_same_objects():
    """Options shared by several classes are one ``Opt`` (one default), not copies."""
    assert (VideoRecurrentTrainDataset.OPTIONS["use_hflip"] is DATASETS["syntheticvideotraindataset"].OPTIONS[
        "use_hflip"] is dataset_options.AUGMENT["use_hflip"])
    assert (VideoRecurrentTrainNonblindDenoisingDataset.OPTIONS["sigma_max"]
            is DATASETS["syntheticvideotraindataset"].OPTIONS["sigma_max"])
    assert (DATASETS["videotestvimeo90kdataset"].OPTIONS["num_frame"]
            is VideoRecurrentTrainVimeoDataset.OPTIONS["num_frame"])
