"""KAIR's own VRT/RVRT option files load unchanged, and keys of sibling dataset types are accepted with a note."""

from __future__ import annotations

import glob
import json
import logging
import os

import pytest

from engine.options import parse_options
from utils.utils_option import OptionError, load_json

KAIR_FILES = sorted(glob.glob(os.path.join(os.path.dirname(__file__), "fixtures", "kair_options", "*.json")))


def test_the_fixtures_are_kairs_fifteen_vrt_and_rvrt_files():
    assert len(KAIR_FILES) == 15
    assert sum("/vrt_" in p for p in KAIR_FILES) == 9 and sum("/rvrt_" in p for p in KAIR_FILES) == 6


@pytest.mark.parametrize("path", KAIR_FILES, ids=os.path.basename)
def test_kair_files_load_unchanged(path):
    opt = parse_options(path)
    assert opt["netG"]["net_type"] in ("vrt", "rvrt")
    assert opt["datasets"]["train"]["dataloader_batch_size"] >= 1


def _vimeo(tmp_path, **changes) -> str:
    """KAIR's Vimeo-90K recipe with changes to its sections (``train``/``test`` dataset keys)."""
    tree = load_json(next(p for p in KAIR_FILES if p.endswith("vrt_003_train_vrt_videosr_bi_vimeo_7frames.json")))
    for phase, values in changes.items():
        tree["datasets"][phase].update(values)
    path = tmp_path / "vimeo.json"
    path.write_text(json.dumps(tree))
    return str(path)


def test_a_sibling_datasets_key_is_accepted_with_one_note(tmp_path, caplog):
    """``filename_tmpl`` (REDS reads it, Vimeo does not) and ``val_partition`` on a test set, as KAIR ran them."""
    path = _vimeo(tmp_path, train={"filename_tmpl": "08d"}, test={"val_partition": "REDS4"})
    with caplog.at_level(logging.INFO):
        opt = parse_options(path)
    assert "filename_tmpl" not in opt["datasets"]["train"] and "val_partition" not in opt["datasets"]["test"]
    notes = [r.getMessage() for r in caplog.records if "has no effect for this dataset type" in r.getMessage()]
    assert len(notes) == 2
    assert "datasets.train.filename_tmpl" in notes[0] and "videorecurrenttraindataset reads it" in notes[0]
    assert "datasets.test.val_partition" in notes[1]


def test_a_key_no_dataset_reads_is_an_error_that_suggests_the_key_meant(tmp_path):
    with pytest.raises(OptionError, match=r"unknown option 'datasets.train.filename_tmpll'; did you mean "
                                          r"'filename_tmpl'\?"):
        parse_options(_vimeo(tmp_path, train={"filename_tmpll": "08d"}))
    with pytest.raises(OptionError, match=r"unknown option 'datasets.train.no_such_key'"):
        parse_options(_vimeo(tmp_path, train={"no_such_key": 1}))


def test_netg_stays_strict(tmp_path):
    """A constructor argument of another network (RVRT's ``clip_size``) is still an error in VRT's ``netG``."""
    tree = load_json(KAIR_FILES[-1])
    tree["netG"]["clip_size"] = 2
    path = tmp_path / "vrt.json"
    path.write_text(json.dumps(tree))
    with pytest.raises(OptionError, match=r"netG.clip_size"):
        parse_options(str(path))
