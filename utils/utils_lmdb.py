"""LMDB writer in KAIR/BasicSR's format, so that LMDBs made here and there are interchangeable.

Format: one LMDB value per image, holding the image re-encoded as PNG (``cv2.IMWRITE_PNG_COMPRESSION``, level 1
by default; JPEG sources become PNG too) under the ASCII key ``<relative path without extension>``
(``000/00000000``, ``00001/0001/im4``); plus ``<lmdb>/meta_info.txt`` with one ``<key>.png (h,w,c) <level>``
line per image (the ``.png`` is always written, as KAIR does).

Unlike KAIR, images are read and encoded by a pool of worker processes while streaming (not all in RAM first),
the map grows when full instead of failing, and an existing output is refused unless ``overwrite``.
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Iterable, Sequence
from multiprocessing import Pool

import cv2
import numpy as np
from tqdm import tqdm

logger = logging.getLogger(__name__)

__all__ = ["encode_png", "make_lmdb_from_imgs", "read_lmdb_meta"]


def encode_png(path: str, compress_level: int = 1) -> tuple[bytes, tuple[int, int, int]]:
    """Read an image file unchanged and re-encode it as PNG bytes.

    Returns:
        ``(png_bytes, (h, w, c))``.

    Raises:
        ValueError: the file cannot be decoded (its path is named).
    """
    img = cv2.imread(path, cv2.IMREAD_UNCHANGED)
    if img is None:
        raise ValueError(f"cannot read image {path}")
    ok, buf = cv2.imencode(".png", img, [cv2.IMWRITE_PNG_COMPRESSION, compress_level])
    if not ok:
        raise ValueError(f"cannot encode {path} as PNG")
    h, w = img.shape[:2]
    return buf.tobytes(), (h, w, 1 if img.ndim == 2 else img.shape[2])


def _encode_job(job: tuple[str, int]) -> tuple[bytes, tuple[int, int, int]]:
    return encode_png(*job)


def make_lmdb_from_imgs(data_path: str, lmdb_path: str, img_path_list: Sequence[str], keys: Sequence[str],
                        batch: int = 5000, compress_level: int = 1, n_thread: int = 4, map_size: int | None = None,
                        overwrite: bool = False, progress: bool = True) -> None:
    """Write ``data_path/img_path_list[i]`` under ``keys[i]`` into a new LMDB at ``lmdb_path`` (KAIR format).

    Args:
        data_path: folder the image paths are relative to.
        lmdb_path: output folder; must end with ``.lmdb``.
        img_path_list: relative image paths.
        keys: one ASCII key per image.
        batch: commit every ``batch`` images.
        compress_level: PNG compression level (0-9).
        n_thread: worker processes reading and encoding (1: in this process).
        map_size: initial LMDB map size in bytes (default: 10x the first image's PNG size x the image count);
            the map doubles whenever it is full.
        overwrite: delete an existing ``lmdb_path`` first (otherwise it is an error).
        progress: show a tqdm progress bar.

    Raises:
        ValueError: bad arguments, an existing output without ``overwrite``, or an unreadable image.
    """
    import lmdb

    if len(img_path_list) != len(keys):
        raise ValueError(f"img_path_list and keys differ in length: {len(img_path_list)} vs {len(keys)}")
    if not img_path_list:
        raise ValueError(f"no image to write into {lmdb_path}")
    if not lmdb_path.endswith(".lmdb"):
        raise ValueError(f"lmdb_path must end with '.lmdb', got {lmdb_path}")
    if os.path.exists(lmdb_path):
        if not overwrite:
            raise ValueError(f"{lmdb_path} already exists; remove it or pass --overwrite")
        shutil.rmtree(lmdb_path)
    bad = [k for k in keys if not k.isascii()]
    if bad:
        raise ValueError(f"LMDB keys must be ASCII; {len(bad)} are not, e.g. {bad[0]!r}")
    jobs = [(os.path.join(data_path, p), compress_level) for p in img_path_list]
    if map_size is None:
        map_size = max(len(encode_png(*jobs[0])[0]) * len(jobs) * 10, 1 << 24)
    logger.info("writing %d images from %s into %s", len(jobs), data_path, lmdb_path)
    os.makedirs(os.path.dirname(os.path.abspath(lmdb_path)), exist_ok=True)
    env = lmdb.open(lmdb_path, map_size=map_size)
    meta_lines = []
    pool = Pool(n_thread) if n_thread > 1 else None
    try:
        encoded: Iterable[tuple[bytes, tuple[int, int, int]]] = (
            pool.imap(_encode_job, jobs, chunksize=8) if pool is not None else map(_encode_job, jobs))
        txn = env.begin(write=True)
        for idx, (key, (data, (h, w, c))) in enumerate(tqdm(zip(keys, encoded), total=len(jobs), unit="img",
                                                            desc=os.path.basename(lmdb_path), disable=not progress)):
            while True:
                try:
                    txn.put(key.encode("ascii"), data)
                    break
                except lmdb.MapFullError:
                    txn.abort()
                    map_size *= 2
                    env.set_mapsize(map_size)
                    txn = env.begin(write=True)
                    for k2, d2 in _replay(meta_lines, idx, batch, data_path, img_path_list, keys, compress_level):
                        txn.put(k2.encode("ascii"), d2)
            meta_lines.append(f"{key}.png ({h},{w},{c}) {compress_level}\n")
            if (idx + 1) % batch == 0:
                txn.commit()
                txn = env.begin(write=True)
        txn.commit()
    finally:
        if pool is not None:
            pool.close()
            pool.join()
        env.close()
    with open(os.path.join(lmdb_path, "meta_info.txt"), "w") as f:
        f.writelines(meta_lines)


def _replay(meta_lines: list[str], idx: int, batch: int, data_path: str, img_path_list: Sequence[str],
            keys: Sequence[str], compress_level: int) -> Iterable[tuple[str, bytes]]:
    """Re-encode the images of the aborted (uncommitted) transaction: indices ``[idx - idx % batch, idx)``."""
    for i in range(idx - idx % batch, idx):
        yield keys[i], encode_png(os.path.join(data_path, img_path_list[i]), compress_level)[0]


def read_lmdb_meta(lmdb_path: str) -> list[tuple[str, tuple[int, int, int]]]:
    """Parse ``<lmdb>/meta_info.txt``: ``[(key, (h, w, c))]`` (key without the ``.png``)."""
    out = []
    with open(os.path.join(lmdb_path, "meta_info.txt")) as f:
        for line in f:
            if line.strip():
                name, shape, _ = line.split()
                out.append((name[:-4] if name.endswith(".png") else name,
                            tuple(int(v) for v in shape.strip("()").split(","))))
    return out


def lmdb_image(lmdb_path: str, key: str) -> np.ndarray:
    """Decode one image from an LMDB (uint8, OpenCV channel order); for checks and tests."""
    import lmdb

    env = lmdb.open(lmdb_path, readonly=True, lock=False, readahead=False, meminit=False)
    try:
        with env.begin(write=False) as txn:
            data = txn.get(key.encode("ascii"))
    finally:
        env.close()
    if data is None:
        raise KeyError(f"key {key!r} is not in {lmdb_path}")
    return cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_UNCHANGED)
