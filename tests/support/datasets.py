"""Builders of small on-disk training sets (REDS-like clip folders, Vimeo-90K-like septuplets, KAIR-style LMDBs),
shared by the dataset tests."""

from __future__ import annotations

import os
import random

import cv2
import lmdb
import numpy as np
import torch

__all__ = ["LQ_HW", "NFRAMES", "SCALE", "item", "lmdb_opt", "lq_frame", "make_reds", "make_vimeo", "upsample",
           "write_lmdb_kair"]

SCALE = 4
LQ_HW = (12, 16)
NFRAMES = 8


def lq_frame(clip: int, t: int) -> np.ndarray:
    """A BGR uint8 LQ frame whose frames differ by a constant per time step (to test shared crops/flips)."""
    rng = np.random.default_rng(clip)
    return (rng.integers(0, 150, (*LQ_HW, 3)) + 10 * t).astype(np.uint8)


def upsample(img: np.ndarray, scale: int = SCALE) -> np.ndarray:
    return img.repeat(scale, axis=0).repeat(scale, axis=1)


def write_lmdb_kair(folder: str, lmdb_path: str, ext: str = "png") -> list[str]:
    """Write an LMDB the way KAIR/BasicSR's make_lmdb_from_imgs does (PNG bytes, relative keys, meta_info.txt)."""
    paths = sorted(os.path.relpath(os.path.join(d, f), folder) for d, _, fs in os.walk(folder) for f in fs
                   if f.endswith(ext))
    env = lmdb.open(lmdb_path, map_size=1 << 26)
    lines = []
    with env.begin(write=True) as txn:
        for rel in paths:
            img = cv2.imread(os.path.join(folder, rel), cv2.IMREAD_UNCHANGED)
            _, buf = cv2.imencode(".png", img, [cv2.IMWRITE_PNG_COMPRESSION, 1])
            key = rel.rsplit(".", 1)[0]
            txn.put(key.encode("ascii"), buf.tobytes())
            h, w, c = img.shape
            lines.append(f"{key}.png ({h},{w},{c}) 1\n")
    env.close()
    with open(os.path.join(lmdb_path, "meta_info.txt"), "w") as f:
        f.writelines(lines)
    return [ln.split(".png")[0] for ln in lines]


def _meta_and_lmdb(root: str, name: str, lines: list[str], lmdb_too: bool) -> str:
    """Write the meta-info file ``<root>/<name>`` and, with ``lmdb_too``, KAIR LMDBs of ``lq/`` and ``gt/``."""
    meta = os.path.join(root, name)
    with open(meta, "w") as f:
        f.writelines(f"{line}\n" for line in lines)
    if lmdb_too:
        for sub in ("lq", "gt"):
            write_lmdb_kair(os.path.join(root, sub), os.path.join(root, f"{sub}.lmdb"))
    return meta


def make_reds(root: str, clips: tuple[str, ...] = ("000", "001", "011"), lmdb_too: bool = False) -> dict:
    """GT = nearest x4 upsampling of LQ. Returns a VideoRecurrentTrainDataset option dict (disk backend)."""
    for c, clip in enumerate(clips):
        for t in range(NFRAMES):
            lq = lq_frame(c, t)
            for sub, img in (("lq", lq), ("gt", upsample(lq))):
                os.makedirs(os.path.join(root, sub, clip), exist_ok=True)
                cv2.imwrite(os.path.join(root, sub, clip, f"{t:08d}.png"), img)
    meta = _meta_and_lmdb(root, "meta.txt", [f"{clip} {NFRAMES} ({LQ_HW[0] * SCALE},{LQ_HW[1] * SCALE},3) 00000000"
                                             for clip in clips], lmdb_too)
    return {"name": "train_dataset", "dataset_type": "VideoRecurrentTrainDataset", "phase": "train",
            "dataroot_gt": os.path.join(root, "gt"), "dataroot_lq": os.path.join(root, "lq"), "meta_info_file": meta,
            "filename_tmpl": "08d", "filename_ext": "png", "val_partition": "REDS4", "test_mode": False,
            "io_backend": {"type": "disk"}, "num_frame": 4, "gt_size": 32, "scale": SCALE, "interval_list": [1],
            "random_reverse": True, "use_hflip": True, "use_rot": True}


def lmdb_opt(opt: dict, root: str) -> dict:
    return {**opt, "dataroot_gt": os.path.join(root, "gt.lmdb"), "dataroot_lq": os.path.join(root, "lq.lmdb"),
            "io_backend": {"type": "lmdb"}}


def item(ds, index: int, seed: int = 0) -> dict:
    random.seed(seed)
    torch.manual_seed(seed)
    return ds[index]


def make_vimeo(root: str, n_seq: int = 2, lmdb_too: bool = False) -> dict:
    """Septuplets with frame n a constant 20 n (GT 16x16, LQ 4x4 = nearest x1/4 of it)."""
    keys = [f"00001/{s + 1:04d}" for s in range(n_seq)]
    for key in keys:
        for n in range(1, 8):
            gt = np.full((16, 16, 3), 20 * n, np.uint8)
            gt[0, 0] = 5  # a marker to see flips
            for sub, img in (("gt", gt), ("lq", gt[::4, ::4])):
                os.makedirs(os.path.join(root, sub, key), exist_ok=True)
                cv2.imwrite(os.path.join(root, sub, key, f"im{n}.png"), img)
    meta = _meta_and_lmdb(root, "meta_vimeo.txt", [f"{k} 7 (16,16,3)" for k in keys], lmdb_too)
    return {"name": "train_dataset", "dataset_type": "VideoRecurrentTrainVimeoDataset", "dataroot_gt":
            os.path.join(root, "gt"), "dataroot_lq": os.path.join(root, "lq"), "meta_info_file": meta,
            "io_backend": {"type": "disk"}, "num_frame": -1, "gt_size": 8, "scale": 4, "random_reverse": True,
            "use_hflip": True, "use_rot": True}
