"""Storage back-ends (disk, LMDB), frame decoding and the paired crop / flip augmentation of the video datasets.

Frames are addressed by *keys* without extension, e.g. ``000/00000000`` (REDS) or ``00001/0001/im4`` (Vimeo-90K).
On disk a key names ``<root>/<key>.<ext>``; in an LMDB made by KAIR's or BasicSR's ``create_lmdb.py`` it is the
LMDB key itself (the value holds PNG bytes; JPEG sources were re-encoded as PNG, so they read unchanged).

LMDB environments are opened lazily, read-only, with ``lock=False, meminit=False`` and ``readahead=True`` (KAIR
turns readahead off; but a value is a whole PNG frame, and without readahead every 4 KiB page of a frame that is not
cached is a separate read: 2.4x slower from a cold cache in ``benchmarks/bench_data.py --cold``), once per
process: a DataLoader worker re-opens them after fork, and two roots naming the same LMDB (the denoising and
frame-interpolation recipes give the GT LMDB as ``dataroot_lq`` too) share one environment.

Every decoded frame is ``(H, W, 3)`` float32 **BGR** in [0, 1] (OpenCV's order) until :func:`img2tensor` turns a
list of them into ``(3, H, W)`` float32 **RGB** tensors.
"""

from __future__ import annotations

import logging
import os
import random
from collections.abc import Iterator, Sequence
from typing import Any

import cv2
import numpy as np
import torch

logger = logging.getLogger(__name__)

__all__ = [
    "IMAGE_EXTENSIONS",
    "DataCheckError",
    "FrameStore",
    "ImageDecodeError",
    "augment",
    "check_problems",
    "imfrombytes",
    "img2tensor",
    "list_frames",
    "paired_random_crop",
    "read_img_seq",
    "scandir",
]

IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".bmp", ".tif", ".tiff", ".webp", ".ppm")
LMDB_OPEN_KWARGS = {"readonly": True, "lock": False, "readahead": True, "meminit": False}
MAX_LISTED = 5


class DataCheckError(FileNotFoundError, ValueError):
    """A dataset's files do not match what its options promise (missing / unreadable / inconsistent frames)."""


class ImageDecodeError(DataCheckError):
    """Bytes that OpenCV cannot decode as an image (the message names the file or LMDB key)."""


def check_problems(problems: Sequence[str], what: str) -> None:
    """Raise ONE :class:`DataCheckError` listing the first few ``problems`` and how many there are.

    Args:
        problems: one line per offending path / key.
        what: what was being checked, e.g. ``"VideoRecurrentTrainDataset (dataroot_gt=...)"``.
    """
    if not problems:
        return
    listed = "; ".join(problems[:MAX_LISTED])
    more = f" (and {len(problems) - MAX_LISTED} more)" if len(problems) > MAX_LISTED else ""
    raise DataCheckError(f"{what}: {len(problems)} problem(s): {listed}{more}")


def scandir(dir_path: str, suffix: str | tuple[str, ...] | None = None, recursive: bool = False,
            full_path: bool = False) -> Iterator[str]:
    """Yield the non-hidden files under ``dir_path`` (relative paths unless ``full_path``), in directory order.

    Args:
        suffix: keep only names ending with it (case-sensitive, like KAIR/BasicSR).
        recursive: descend into sub-directories (hidden ones are skipped).
    """
    def _scan(path: str) -> Iterator[str]:
        for entry in os.scandir(path):
            if entry.name.startswith("."):
                continue
            if entry.is_file():
                if suffix is None or entry.name.endswith(suffix):
                    yield entry.path if full_path else os.path.relpath(entry.path, dir_path)
            elif recursive and entry.is_dir():
                yield from _scan(entry.path)

    return _scan(dir_path)


def list_frames(folder: str) -> list[str]:
    """The sorted full paths of the image files (by extension, case-insensitive) directly inside ``folder``."""
    return sorted(p for p in scandir(folder, full_path=True) if p.lower().endswith(IMAGE_EXTENSIONS))


def imfrombytes(content: bytes | None, name: str, float32: bool = True) -> np.ndarray:
    """Decode image bytes to ``(H, W, 3)`` BGR, float32 in [0, 1] (``float32``) or uint8.

    Args:
        content: encoded bytes (PNG, JPEG, ...).
        name: the file path or LMDB key, for the error message.

    Raises:
        ImageDecodeError: the bytes are missing, empty or not an image.
    """
    img = None
    if content:
        img = cv2.imdecode(np.frombuffer(content, np.uint8), cv2.IMREAD_COLOR)
    if img is None:
        raise ImageDecodeError(f"cannot decode image {name} ({len(content or b'')} bytes): not a readable image")
    return img.astype(np.float32) / 255.0 if float32 else img


def img2tensor(imgs: Sequence[np.ndarray]) -> list[torch.Tensor]:
    """``(H, W, 3)`` BGR arrays -> ``(3, H, W)`` float32 RGB tensors (same values)."""
    return [torch.from_numpy(np.ascontiguousarray(img[..., ::-1].transpose(2, 0, 1))).float() for img in imgs]


def read_img_seq(paths: Sequence[str]) -> torch.Tensor:
    """Read image files into ``(T, 3, H, W)`` float32 RGB in [0, 1].

    Raises:
        DataCheckError: a file is missing or not decodable (named in the message).
    """
    imgs = []
    for path in paths:
        try:
            with open(path, "rb") as f:
                content = f.read()
        except OSError as err:
            raise DataCheckError(f"cannot read frame {path}: {err.strerror or err}") from err
        imgs.append(imfrombytes(content, path))
    return torch.stack(img2tensor(imgs), dim=0)


def _lmdb_missing(env: Any, keys: Sequence[str]) -> list[str]:
    with env.begin(write=False) as txn:
        cursor = txn.cursor()
        return [k for k in keys if not cursor.set_key(k.encode("ascii"))]


class _LmdbEnvs:
    """Per-process cache of read-only LMDB environments, keyed by real path (one env per LMDB per process)."""

    def __init__(self) -> None:
        self.pid = -1
        self.envs: dict[str, Any] = {}

    def get(self, path: str) -> Any:
        import lmdb

        if self.pid != os.getpid():  # a forked worker must not use its parent's environments
            self.pid, self.envs = os.getpid(), {}
        real = os.path.realpath(path)
        if real not in self.envs:
            if not os.path.isdir(real):
                raise DataCheckError(f"LMDB {path} does not exist (expected a folder with data.mdb)")
            self.envs[real] = lmdb.open(real, subdir=True, max_readers=1024, **LMDB_OPEN_KWARGS)
        return self.envs[real]

    def close(self) -> None:
        if self.pid == os.getpid():
            for env in self.envs.values():
                env.close()
        self.envs = {}


_ENVS = _LmdbEnvs()


class FrameStore:
    """Read frames of one root by key, from a folder of images (``disk``) or an LMDB (``lmdb``).

    Picklable (nothing is opened until the first read), so it crosses into DataLoader workers unopened.

    Args:
        root: the folder or the ``.lmdb`` folder.
        backend: ``"disk"`` or ``"lmdb"``.
        ext: file extension on disk (ignored for LMDB), e.g. ``"png"``.
    """

    def __init__(self, root: str, backend: str = "disk", ext: str = "png") -> None:
        if backend not in ("disk", "lmdb"):
            raise ValueError(f"io_backend type {backend!r} is not supported; use 'disk' or 'lmdb'")
        self.root, self.backend, self.ext = str(root), backend, ext.lstrip(".")

    def __repr__(self) -> str:
        return f"FrameStore({self.root!r}, {self.backend!r})"

    def locate(self, key: str) -> str:
        """The file path (disk) or ``<lmdb>:<key>`` (lmdb) of a key, as used in error messages."""
        if self.backend == "disk":
            return os.path.join(self.root, f"{key}.{self.ext}")
        return f"{self.root}:{key}"

    def get_bytes(self, key: str) -> bytes:
        """The encoded bytes of a frame.

        Raises:
            DataCheckError: the file or key does not exist.
        """
        if self.backend == "disk":
            path = self.locate(key)
            try:
                with open(path, "rb") as f:
                    return f.read()
            except OSError as err:
                raise DataCheckError(f"cannot read frame {path}: {err.strerror or err}") from err
        with _ENVS.get(self.root).begin(write=False) as txn:
            value = txn.get(key.encode("ascii"))
        if value is None:
            raise DataCheckError(f"key {key!r} is not in LMDB {self.root}")
        return value

    def get(self, key: str) -> np.ndarray:
        """Decode a frame: ``(H, W, 3)`` float32 BGR in [0, 1]."""
        return imfrombytes(self.get_bytes(key), self.locate(key))

    def missing(self, keys: Sequence[str]) -> list[str]:
        """The keys of ``keys`` that do not exist, as :meth:`locate` strings (cheap: no decoding).

        On disk one ``listdir`` per folder; in an LMDB a cursor seek per key in one read transaction.
        """
        if self.backend == "lmdb":
            return [self.locate(k) for k in _lmdb_missing(_ENVS.get(self.root), keys)]
        listing: dict[str, set[str]] = {}
        out = []
        for key in keys:
            path = self.locate(key)
            folder, name = os.path.split(path)
            if folder not in listing:
                listing[folder] = set(os.listdir(folder)) if os.path.isdir(folder) else set()
            if name not in listing[folder]:
                out.append(path)
        return out

    def exists(self) -> bool:
        """Whether the root exists (a folder for disk; a folder with ``data.mdb`` for LMDB)."""
        if self.backend == "lmdb":
            return os.path.isfile(os.path.join(self.root, "data.mdb"))
        return os.path.isdir(self.root)

    @staticmethod
    def close_all() -> None:
        """Close this process's LMDB environments (they re-open lazily on the next read)."""
        _ENVS.close()


def make_store(root: str, io_backend: dict[str, Any] | None, ext: str = "png") -> FrameStore:
    """A :class:`FrameStore` from an ``io_backend`` option dict (``{"type": "disk" | "lmdb"}``; not modified)."""
    backend = dict(io_backend or {}).get("type", "disk")
    return FrameStore(root, backend, ext)


def paired_random_crop(img_gts: list[np.ndarray], img_lqs: list[np.ndarray], gt_patch_size: int, scale: int,
                       name: str = "") -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Crop the same random window from every frame: ``gt_patch_size // scale`` in LQ, at ``scale`` x in GT.

    Draws ``random.randint`` for the top, then the left, of the LQ window (KAIR/BasicSR's order).

    Args:
        img_gts: ``(H, W, C)`` arrays, all the same shape.
        img_lqs: ``(H / scale, W / scale, C')`` arrays, all the same shape.
        name: the clip / key, for error messages.

    Raises:
        ValueError: GT is not ``scale`` x LQ, or LQ is smaller than the patch.
    """
    h_lq, w_lq = img_lqs[0].shape[:2]
    h_gt, w_gt = img_gts[0].shape[:2]
    lq_patch = gt_patch_size // scale
    if h_gt != h_lq * scale or w_gt != w_lq * scale:
        raise ValueError(f"{name}: GT ({h_gt}, {w_gt}) is not {scale}x the LQ ({h_lq}, {w_lq})")
    if h_lq < lq_patch or w_lq < lq_patch:
        raise ValueError(f"{name}: LQ ({h_lq}, {w_lq}) is smaller than the patch ({lq_patch}, {lq_patch}); "
                         "lower gt_size or remove the clip")
    top = random.randint(0, h_lq - lq_patch)
    left = random.randint(0, w_lq - lq_patch)
    lqs = [v[top:top + lq_patch, left:left + lq_patch] for v in img_lqs]
    top_gt, left_gt = top * scale, left * scale
    gts = [v[top_gt:top_gt + gt_patch_size, left_gt:left_gt + gt_patch_size] for v in img_gts]
    return gts, lqs


def augment(imgs: list[np.ndarray], hflip: bool = True, rotation: bool = True) -> list[np.ndarray]:
    """The same random flips for every image: hflip (p 0.5), then vflip (p 0.5) and a transpose (p 0.5).

    Draws ``random.random()`` for each enabled flip in that order (KAIR/BasicSR's order). Inputs are not
    modified.
    """
    hflip = hflip and random.random() < 0.5
    vflip = rotation and random.random() < 0.5
    rot90 = rotation and random.random() < 0.5
    out = []
    for img in imgs:
        if hflip:
            img = img[:, ::-1]
        if vflip:
            img = img[::-1]
        if rot90:
            img = img.transpose(1, 0, 2)
        out.append(np.ascontiguousarray(img))
    return out
