"""KAIR's own VRT/RVRT option files load unchanged, and keys of sibling dataset types are accepted with a note."""

from __future__ import annotations

import glob
import json
import logging
import os

import pytest

from data.dataset_options import DATASET_FAMILIES, family_of
from data.select_dataset import option_specs
from engine.options import log_kair_notes, parse_options
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
    """``filename_tmpl`` (REDS reads it, Vimeo does not) and ``val_partition`` on a test set, as KAIR ran them; the
    notes are collected for the caller to log once its log exists (parsing comes before it), not logged then."""
    path = _vimeo(tmp_path, train={"filename_tmpl": "08d"}, test={"val_partition": "REDS4"})
    notes: list[str] = []
    with caplog.at_level(logging.INFO):
        opt = parse_options(path, notes=notes)
    assert "filename_tmpl" not in opt["datasets"]["train"] and "val_partition" not in opt["datasets"]["test"]
    assert "has no effect" not in caplog.text
    assert len(notes) == 2 and all("has no effect for this dataset type" in n for n in notes)
    assert "datasets.train.filename_tmpl" in notes[0] and "videorecurrenttraindataset reads it" in notes[0]
    assert "datasets.test.val_partition" in notes[1]
    with caplog.at_level(logging.INFO):
        log_kair_notes(path, notes)
    assert [r.getMessage() for r in caplog.records if "has no effect for this" in r.getMessage()] == notes


def test_the_families_are_kairs_dataset_types_and_ours_are_in_none():
    specs = option_specs()
    kair = DATASET_FAMILIES["KAIR video datasets"]
    assert kair <= set(specs) and family_of("videorecurrenttrainvimeodataset") == kair
    assert set(specs) - kair == {"syntheticvideotraindataset", "syntheticvideotestdataset", "videofiletestdataset",
                                 "videofiletraindataset"}
    assert all(not family_of(kind) for kind in set(specs) - kair)


def test_a_key_of_a_type_outside_the_family_is_an_error_naming_its_reader(tmp_path):
    """``task`` is read by the synthetic sets (ours), not by KAIR's family: no note, and no other key proposed."""
    with pytest.raises(OptionError, match=r"^unknown option 'datasets.train.task': synthetic\w+ reads it; this "
                                          r"dataset type and its family do not$"):
        parse_options(_vimeo(tmp_path, train={"task": "sr"}))
    tree = load_json(_vimeo(tmp_path))  # and the other way round: a KAIR key on one of ours
    tree["datasets"]["test"] = {"dataset_type": "SyntheticVideoTestDataset", "val_partition": "REDS4"}
    (tmp_path / "synthetic.json").write_text(json.dumps(tree))
    with pytest.raises(OptionError, match=r"'datasets.test.val_partition': videorecurrenttraindataset reads it"):
        parse_options(str(tmp_path / "synthetic.json"))


def test_a_key_no_dataset_reads_is_an_error_that_prefers_the_types_own_keys(tmp_path):
    """The closest key that only a sibling reads would be accepted without effect, so it is named as such, never
    offered as the fix when the type has a close key of its own; with none, it is offered with that warning."""
    for written in ("filename_tmp", "filename_tmpll"):
        with pytest.raises(OptionError, match=rf"^unknown option 'datasets.train.{written}'; did you mean "
                                              r"'filename_ext'\? \('filename_tmpl', closer, is read by "
                                              r"videorecurrenttraindataset: no effect here\)$"):
            parse_options(_vimeo(tmp_path, train={written: "08d"}))
    with pytest.raises(OptionError, match=r"'datasets.test.val_partitio'; did you mean 'val_partition'\? \(read by "
                                          r"videorecurrenttraindataset; no effect here\)$"):
        parse_options(_vimeo(tmp_path, test={"val_partitio": "REDS4"}))
    with pytest.raises(OptionError, match=r"'datasets.train.num_fram'; did you mean 'num_frame'\?$"):
        parse_options(_vimeo(tmp_path, train={"num_fram": 7}))
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
