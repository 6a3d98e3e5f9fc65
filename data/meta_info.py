"""Clip lists (KAIR's ``meta_info_file``): made from a data set's own frames, and written on first use when an option
file names a list that is not there.

KAIR ships nine lists (REDS, DAVIS, DVD, GoPro, Vimeo-90K train and test with its fast/medium/slow splits); this
repository ships REDS's (``data/meta_info/``) and makes the others from the data the option file points at, the
first time a data set needs one, with a line saying so:

- clip folders (DAVIS, DVD, GoPro, REDS): ``clip nframes (h,w,c) start_frame`` per clip, from the frame folders of
  ``dataroot_gt`` or from the keys of its LMDB (``meta_info.txt``, written by ``create_lmdb.py``);
- Vimeo-90K: ``clip/seq nframes (h,w,c)`` per septuplet, from the keys of its LMDB (the GT LMDB holds the training
  septuplets only), or, for a frame folder (which holds both training and test septuplets), in the order of the
  split's own list (``sep_trainlist.txt`` / ``sep_testlist.txt`` of the Vimeo-90K download) found beside it. The
  test set's fast/medium/slow splits are chosen by motion and cannot be made from the frames.

``scripts/data_preparation/generate_meta_info.py`` writes the same lists by hand.
"""

from __future__ import annotations

import logging
import os
from collections import OrderedDict
from collections.abc import Iterable, Sequence

import cv2

from utils import utils_dist
from utils.utils_fs import atomic_open
from utils.utils_lmdb import read_lmdb_meta
from utils.utils_video import IMAGE_EXTENSIONS, DataCheckError

logger = logging.getLogger(__name__)

FORMATS = ("clips", "vimeo")
VIMEO_SPLIT_LISTS = {"train": "sep_trainlist.txt", "test": "sep_testlist.txt"}


def _frames(folder: str) -> list[str]:
    return sorted(n for n in os.listdir(folder) if not n.startswith(".") and n.lower().endswith(IMAGE_EXTENSIONS))


def _shape(path: str) -> str:
    img = cv2.imread(path, cv2.IMREAD_UNCHANGED)
    if img is None:
        raise DataCheckError(f"cannot read image {path}")
    c = 1 if img.ndim == 2 else img.shape[2]
    return f"({img.shape[0]},{img.shape[1]},{c})"


def _clip_line(clip: str, stems: Sequence[str], shape: str, bad: list[str]) -> str | None:
    """``clip nframes (h,w,c) start`` for consecutively numbered frame ``stems`` (sorted), else ``None`` with the
    reason appended to ``bad``."""
    if not all(s.isdigit() for s in stems):
        bad.append(f"{clip}: non-numeric frame name {next(s for s in stems if not s.isdigit())!r}")
        return None
    nums = [int(s) for s in stems]
    if nums != list(range(nums[0], nums[0] + len(nums))):
        gap = next(a for a, b in zip(nums, nums[1:]) if b != a + 1)
        bad.append(f"{clip}: frames not consecutive after {gap}")
        return None
    return f"{clip} {len(stems)} {shape} {stems[0]}\n"


def _raise_bad(bad: list[str]) -> None:
    if bad:
        raise DataCheckError(f"{len(bad)} clip(s) cannot be listed: {'; '.join(bad[:5])}")


def clip_lines(root: str) -> list[str]:
    """``clip nframes (h,w,c) start`` for every clip sub-folder of the frame folder ``root`` (sorted; the start keeps
    its zero padding, e.g. ``00000`` for DAVIS).

    Raises:
        DataCheckError: a clip's frame names are not consecutive numbers (the clip and the gap are named).
    """
    lines, bad = [], []
    for clip in sorted(d for d in os.listdir(root) if os.path.isdir(os.path.join(root, d))):
        names = _frames(os.path.join(root, clip))
        if names:
            stems = [os.path.splitext(n)[0] for n in names]
            line = _clip_line(clip, stems, _shape(os.path.join(root, clip, names[0])), bad)
            if line:
                lines.append(line)
    _raise_bad(bad)
    return lines


def clip_lines_from_keys(keys: Iterable[tuple[str, tuple[int, int, int]]]) -> list[str]:
    """The clip list of an LMDB of clip folders, from its ``(clip/frame, (h, w, c))`` keys."""
    clips: OrderedDict[str, list[str]] = OrderedDict()
    shapes: dict[str, tuple[int, int, int]] = {}
    for key, shape in keys:
        clip, _, frame = key.rpartition("/")
        clips.setdefault(clip, []).append(frame)
        shapes.setdefault(clip, shape)
    lines, bad = [], []
    for clip in sorted(clips):
        stems = sorted(clips[clip], key=lambda s: (len(s), s))
        line = _clip_line(clip, stems, "({},{},{})".format(*shapes[clip]), bad)
        if line:
            lines.append(line)
    _raise_bad(bad)
    return lines


def vimeo_lines(root: str, seqs: Sequence[str] | None) -> list[str]:
    """``clip/seq nframes (h,w,c)`` per septuplet folder of ``root``, in the order of ``seqs`` (all, sorted, when
    ``None``); the shape is read from the first septuplet's first frame.

    Raises:
        DataCheckError: a listed septuplet is missing, or there is none.
    """
    if seqs is None:
        seqs = sorted(f"{c}/{s}" for c in os.listdir(root) if os.path.isdir(os.path.join(root, c))
                      for s in os.listdir(os.path.join(root, c)) if os.path.isdir(os.path.join(root, c, s)))
    if not seqs:
        raise DataCheckError(f"no septuplet under {root}")
    first = os.path.join(root, seqs[0])
    if not os.path.isdir(first):
        raise DataCheckError(f"septuplet {first} is missing")
    shape = _shape(os.path.join(first, _frames(first)[0]))
    lines, missing = [], []
    for seq in seqs:
        path = os.path.join(root, seq)
        if os.path.isdir(path):
            lines.append(f"{seq} {len(_frames(path))} {shape}\n")
        else:
            missing.append(path)
    if missing:
        raise DataCheckError(f"{len(missing)} listed septuplet(s) missing, e.g. {missing[:3]}")
    return lines


def vimeo_lines_from_keys(keys: Iterable[tuple[str, tuple[int, int, int]]]) -> list[str]:
    """The septuplet list of a Vimeo-90K LMDB, from its ``(clip/seq/imN, (h, w, c))`` keys (in their order)."""
    seqs: OrderedDict[str, int] = OrderedDict()
    shape = None
    for key, key_shape in keys:
        seq = key.rpartition("/")[0]
        seqs[seq] = seqs.get(seq, 0) + 1
        shape = shape or key_shape
    return [f"{seq} {n} ({shape[0]},{shape[1]},{shape[2]})\n" for seq, n in seqs.items()] if shape else []


def _split_list(meta_path: str, root: str) -> str | None:
    """The Vimeo-90K split list (``sep_trainlist.txt`` / ``sep_testlist.txt``) that the list file ``meta_path`` is
    made from, looked for beside the frame folder ``root`` and up to two folders above it."""
    name = os.path.basename(meta_path).lower()
    split = "test" if "test" in name else "train"
    folder = os.path.abspath(root)
    for _ in range(3):
        candidate = os.path.join(folder, VIMEO_SPLIT_LISTS[split])
        if os.path.isfile(candidate):
            return candidate
        folder = os.path.dirname(folder)
    return None


def _how_to(meta_path: str, root: str, fmt: str) -> str:
    split = VIMEO_SPLIT_LISTS["test" if "test" in os.path.basename(meta_path).lower() else "train"]
    extra = f" --format vimeo --list <vimeo_septuplet>/{split}" if fmt == "vimeo" else ""
    return (f"python scripts/data_preparation/generate_meta_info.py --input {root}{extra} --output {meta_path} "
            "(docs/datasets.md)")


def make_lines(meta_path: str, root: str, fmt: str) -> list[str]:
    """The clip list ``meta_path`` names, made from the data at ``root`` (an LMDB or a frame folder).

    Raises:
        DataCheckError: the list cannot be made from this data (one line saying why and how to write it).
    """
    if fmt not in FORMATS:
        raise ValueError(f"unknown meta_info format {fmt!r}; one of {FORMATS}")
    lmdb_meta = os.path.join(root, "meta_info.txt")
    if root.endswith(".lmdb") or os.path.isfile(lmdb_meta):
        if not os.path.isfile(lmdb_meta):
            raise DataCheckError(f"meta_info_file {meta_path} is missing and the LMDB {root} has no meta_info.txt "
                                 f"to list its clips from; write the list with {_how_to(meta_path, root, fmt)}")
        keys = read_lmdb_meta(root)
        return vimeo_lines_from_keys(keys) if fmt == "vimeo" else clip_lines_from_keys(keys)
    if not os.path.isdir(root):
        raise DataCheckError(f"meta_info_file {meta_path} is missing and cannot be made: {root} is not a folder")
    if fmt == "clips":
        return clip_lines(root)
    if any(s in os.path.basename(meta_path).lower() for s in ("fast", "medium", "slow")):
        raise DataCheckError(f"meta_info_file {meta_path} is missing: Vimeo-90K's fast/medium/slow test splits are "
                             "chosen by motion and cannot be made from the frames; use KAIR's file "
                             "(data/meta_info/ of github.com/cszn/KAIR)")
    split = _split_list(meta_path, root)
    if split is None:
        raise DataCheckError(f"meta_info_file {meta_path} is missing and {root} holds every Vimeo-90K septuplet "
                             f"(training and test): write the split's list with {_how_to(meta_path, root, fmt)}")
    with open(split) as f:
        seqs = [ln.split()[0] for ln in f if ln.strip()]
    return vimeo_lines(root, seqs)


def ensure_meta_info(meta_path: str, root: str | None, fmt: str) -> None:
    """Write the clip list ``meta_path`` from the data at ``root`` when it does not exist (rank 0, atomically; the
    other ranks then read it), with one line saying so.

    Raises:
        DataCheckError: on every rank, when the list is missing and cannot be made (the message says how to write
            it).
    """
    if os.path.exists(meta_path):
        return

    def write() -> None:
        if not root:
            raise DataCheckError(f"meta_info_file {meta_path} is missing and the data set names no dataroot_gt to "
                                 "list clips from")
        lines = make_lines(meta_path, root, fmt)
        if not lines:
            raise DataCheckError(f"meta_info_file {meta_path} is missing and {root} holds no clip to list")
        with atomic_open(meta_path, "w") as f:
            f.writelines(lines)
        logger.info("meta_info_file %s did not exist: wrote it from %s (%d clips). KAIR ships this list; this one "
                    "lists the data you have", meta_path, root, len(lines))

    utils_dist.rank0_first(write, catch=(DataCheckError, OSError), raise_as=lambda _, text: DataCheckError(text))
