"""KAIR's clip lists that we do not ship (DAVIS, DVD, GoPro, Vimeo-90K) are written on first use from the data the
option file points at, in KAIR's format, with a line saying so; a list that cannot be made is one line saying how
(issue 25, item 9)."""

from __future__ import annotations

import json
import logging
import os

import cv2
import numpy as np
import pytest

from data.meta_info import ensure_meta_info
from data.select_dataset import define_Dataset
from engine.options import parse_options
from tests.support.datasets import make_vimeo, write_lmdb_kair
from utils.utils_option import load_json
from utils.utils_video import DataCheckError

KAIR = os.path.join(os.path.dirname(__file__), "fixtures", "kair_options")


def _davis(root, clips=(("bear", 7), ("bike-packing", 6))):
    """DAVIS-like frame folders: 5-digit JPEG names from 00000, 24x32 frames."""
    for c, (clip, n) in enumerate(clips):
        os.makedirs(os.path.join(root, clip))
        for t in range(n):
            img = np.full((24, 32, 3), 10 * c + t, np.uint8)
            cv2.imwrite(os.path.join(root, clip, f"{t:05d}.png"), img)


def test_kairs_davis_recipe_starts_with_a_list_made_from_its_lmdb(tmp_path, monkeypatch, caplog):
    """KAIR's DAVIS file names data/meta_info/meta_info_DAVIS_train_GT.txt, which KAIR ships and we do not: the
    data set writes it from the LMDB's keys and reads it back (it stopped at start before)."""
    _davis(tmp_path / "frames")
    (tmp_path / "DAVIS").mkdir()
    write_lmdb_kair(str(tmp_path / "frames"), str(tmp_path / "DAVIS" / "train_GT.lmdb"))
    monkeypatch.chdir(tmp_path)  # the file's paths are relative to the working directory, as KAIR's
    path = os.path.join(KAIR, "vrt_008_train_vrt_videodenoising_davis.json")
    opt = parse_options(path, [f"datasets.train.dataroot_gt={tmp_path / 'DAVIS' / 'train_GT.lmdb'}",
                               f"datasets.train.dataroot_lq={tmp_path / 'DAVIS' / 'train_GT.lmdb'}",
                               "datasets.train.gt_size=16"])
    meta = opt["datasets"]["train"]["meta_info_file"]
    assert meta == "data/meta_info/meta_info_DAVIS_train_GT.txt" and not os.path.exists(meta)
    with caplog.at_level(logging.INFO):
        ds = define_Dataset(opt["datasets"]["train"])
    assert open(meta).read() == "bear 7 (24,32,3) 00000\nbike-packing 6 (24,32,3) 00000\n"  # KAIR's format
    assert len(ds) > 0 and "did not exist: wrote it from" in caplog.text
    stamp = os.stat(meta).st_mtime_ns
    define_Dataset(opt["datasets"]["train"])
    assert os.stat(meta).st_mtime_ns == stamp  # written once, then read


def test_a_list_from_frame_folders_keeps_the_start_frame_padding(tmp_path):
    _davis(tmp_path / "gt", clips=(("GOPR0372_07_00", 3),))
    os.rename(tmp_path / "gt" / "GOPR0372_07_00" / "00002.png", tmp_path / "gt" / "GOPR0372_07_00" / "00047.png")
    with pytest.raises(DataCheckError, match="GOPR0372_07_00: frames not consecutive after 1"):
        ensure_meta_info(str(tmp_path / "m.txt"), str(tmp_path / "gt"), "clips")
    assert not os.path.exists(tmp_path / "m.txt")  # nothing half-written
    os.remove(tmp_path / "gt" / "GOPR0372_07_00" / "00047.png")
    ensure_meta_info(str(tmp_path / "m.txt"), str(tmp_path / "gt"), "clips")
    assert open(tmp_path / "m.txt").read() == "GOPR0372_07_00 2 (24,32,3) 00000\n"


def test_vimeo_lists_come_from_the_lmdb_or_the_splits_own_list(tmp_path):
    opt = make_vimeo(str(tmp_path), n_seq=3, lmdb_too=True)
    meta = tmp_path / "data" / "meta_info_Vimeo90K_train_GT.txt"
    ensure_meta_info(str(meta), os.path.join(tmp_path, "gt.lmdb"), "vimeo")
    assert open(meta).read() == "".join(f"00001/{s:04d} 7 (16,16,3)\n" for s in (1, 2, 3))
    ds = define_Dataset({**opt, "meta_info_file": str(meta)})
    assert len(ds) == 3
    # a frame folder holds training and test septuplets: only the split's list says which to take
    test_meta = tmp_path / "data" / "meta_info_Vimeo90K_test_GT.txt"
    with pytest.raises(DataCheckError, match=r"holds every Vimeo-90K septuplet .* --format vimeo --list "
                                             r"<vimeo_septuplet>/sep_testlist.txt --output"):
        ensure_meta_info(str(test_meta), opt["dataroot_gt"], "vimeo")
    (tmp_path / "sep_testlist.txt").write_text("00001/0002\n00001/0003\n")
    ensure_meta_info(str(test_meta), opt["dataroot_gt"], "vimeo")
    assert open(test_meta).read() == "00001/0002 7 (16,16,3)\n00001/0003 7 (16,16,3)\n"
    with pytest.raises(DataCheckError, match="fast/medium/slow test splits are chosen by motion"):
        ensure_meta_info(str(tmp_path / "meta_info_Vimeo90K_test_fast_GT.txt"), opt["dataroot_gt"], "vimeo")


def test_every_kair_file_names_a_list_we_ship_or_can_make(tmp_path):
    """The lists KAIR's fifteen files name: REDS is shipped, the others are made on first use (no other name)."""
    names = set()
    for f in os.listdir(KAIR):
        for section in load_json(os.path.join(KAIR, f))["datasets"].values():
            if section.get("meta_info_file"):
                names.add(os.path.basename(section["meta_info_file"]))
    shipped = set(os.listdir(os.path.join(os.path.dirname(KAIR), "..", "..", "data", "meta_info")))
    assert names - shipped == {"meta_info_DAVIS_train_GT.txt", "meta_info_DVD_train_GT.txt",
                               "meta_info_GoPro_train_GT.txt", "meta_info_Vimeo90K_train_GT.txt",
                               "meta_info_Vimeo90K_test_GT.txt"}, json.dumps(sorted(names))
