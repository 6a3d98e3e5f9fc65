"""Pack image folders into LMDBs in KAIR/BasicSR's format (PNG bytes, ``clip/frame`` keys, ``meta_info.txt``).

General use: one or more ``--input DIR --output NAME.lmdb`` pairs; the keys are the image paths relative to
the input without extension (``000/00000000``, ``00001/0001/im4``), or with ``/`` replaced by ``_``
(``--key-scheme flat``). ``--list FILE`` restricts the images to the folders named by the first field of each
line (Vimeo's ``sep_trainlist.txt`` or a clip list). An existing output is an error unless ``--overwrite``.

Presets (``--dataset``, paths relative to ``--root``, default ``trainsets``), writing what the recipes in
``options/`` read:

======== ============================================================ =========================================
dataset  input folders                                                output LMDBs
======== ============================================================ =========================================
reds     REDS/train_sharp, REDS/train_sharp_bicubic[/X4],             REDS/train_sharp_with_val.lmdb,
         REDS/train_blur (each if present)                            REDS/train_sharp_bicubic_with_val.lmdb,
                                                                      REDS/train_blur_with_val.lmdb
vimeo90k vimeo90k/vimeo_septuplet/sequences (all 7 frames),           vimeo90k/vimeo90k_train_GT_all.lmdb,
         vimeo90k/vimeo_septuplet_matlabLRx4/sequences,               vimeo90k/vimeo90k_train_LR7frames.lmdb,
         vimeo90k/vimeo_septuplet_BDLRx4/sequences (if present);      vimeo90k/vimeo90k_train_BDLR7frames.lmdb
         all restricted to vimeo90k/sep_trainlist.txt
dvd      DVD/train_GT, DVD/train_GT_blurred (JPEG)                    DVD/train_GT.lmdb, DVD/train_GT_blurred.lmdb
gopro    GoPro/train_GT, GoPro/train_GT_blurred                       GoPro/train_GT.lmdb, ...blurred.lmdb
davis    DAVIS/train_GT (JPEG)                                        DAVIS/train_GT.lmdb
======== ============================================================ =========================================

Examples (from the repository root)::

    python scripts/data_preparation/create_lmdb.py --dataset reds --workers 8
    python scripts/data_preparation/create_lmdb.py --input mydata/GT --output mydata/GT.lmdb --ext png jpg
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))

from utils.utils_lmdb import make_lmdb_from_imgs  # noqa: E402
from utils.utils_video import IMAGE_EXTENSIONS, scandir  # noqa: E402

VIMEO_LIST = "vimeo90k/sep_trainlist.txt"
# preset -> [(input folder(s) tried in order, output lmdb, use the Vimeo train list)]
PRESETS: dict[str, list[tuple[tuple[str, ...], str, bool]]] = {
    "reds": [(("REDS/train_sharp",), "REDS/train_sharp_with_val.lmdb", False),
             (("REDS/train_sharp_bicubic/X4", "REDS/train_sharp_bicubic"), "REDS/train_sharp_bicubic_with_val.lmdb",
              False),
             (("REDS/train_blur",), "REDS/train_blur_with_val.lmdb", False)],
    "vimeo90k": [(("vimeo90k/vimeo_septuplet/sequences",), "vimeo90k/vimeo90k_train_GT_all.lmdb", True),
                 (("vimeo90k/vimeo_septuplet_matlabLRx4/sequences",), "vimeo90k/vimeo90k_train_LR7frames.lmdb", True),
                 (("vimeo90k/vimeo_septuplet_BDLRx4/sequences",), "vimeo90k/vimeo90k_train_BDLR7frames.lmdb", True)],
    "dvd": [(("DVD/train_GT",), "DVD/train_GT.lmdb", False),
            (("DVD/train_GT_blurred",), "DVD/train_GT_blurred.lmdb", False)],
    "gopro": [(("GoPro/train_GT",), "GoPro/train_GT.lmdb", False),
              (("GoPro/train_GT_blurred",), "GoPro/train_GT_blurred.lmdb", False)],
    "davis": [(("DAVIS/train_GT",), "DAVIS/train_GT.lmdb", False)],
}


def read_list(path: str) -> list[str]:
    """First field of every non-empty line (``00001/0001`` in Vimeo's list, the clip name in a meta-info file)."""
    with open(path) as f:
        return [ln.split()[0] for ln in f if ln.strip()]


def collect(folder: str, exts: tuple[str, ...], folders: list[str] | None = None,
            key_scheme: str = "relpath") -> tuple[list[str], list[str]]:
    """Relative image paths under ``folder`` (sorted) and their LMDB keys.

    Args:
        exts: lower-case extensions with the dot.
        folders: only the images directly inside these sub-folders (relative), if given.
        key_scheme: ``relpath`` (``clip/frame``) or ``flat`` (``clip_frame``).

    Raises:
        FileNotFoundError: a listed sub-folder is missing (the first few are named).
    """
    if folders is None:
        rels = [p for p in scandir(folder, recursive=True) if p.lower().endswith(exts)]
    else:
        rels, missing = [], []
        for sub in folders:
            path = os.path.join(folder, sub)
            if not os.path.isdir(path):
                missing.append(path)
                continue
            rels += [os.path.join(sub, n) for n in os.listdir(path)
                     if not n.startswith(".") and n.lower().endswith(exts)]
        if missing:
            raise FileNotFoundError(f"{len(missing)} listed folder(s) missing, e.g. {missing[:3]}")
    rels = sorted(r.replace(os.sep, "/") for r in rels)
    keys = [os.path.splitext(r)[0] for r in rels]
    if key_scheme == "flat":
        keys = [k.replace("/", "_") for k in keys]
    return rels, keys


def build(folder: str, output: str, exts: tuple[str, ...], folders: list[str] | None, key_scheme: str,
          workers: int, overwrite: bool, compress_level: int) -> int:
    """Pack one folder into one LMDB; returns the image count."""
    rels, keys = collect(folder, exts, folders, key_scheme)
    if not rels:
        raise SystemExit(f"no image ({', '.join(exts)}) found under {folder}")
    print(f"{folder}: {len(rels)} images -> {output}")
    make_lmdb_from_imgs(folder, output, rels, keys, compress_level=compress_level, n_thread=workers,
                        overwrite=overwrite)
    return len(rels)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--dataset", choices=sorted(PRESETS), help="a preset (see below)")
    parser.add_argument("--root", default="trainsets", help="root of the preset paths")
    parser.add_argument("--input", action="append", default=[], help="image folder (repeatable)")
    parser.add_argument("--output", action="append", default=[], help="output .lmdb, one per --input")
    parser.add_argument("--ext", nargs="+", default=[e.lstrip(".") for e in IMAGE_EXTENSIONS],
                        help="image extensions to pack (default: all common ones)")
    parser.add_argument("--list", help="pack only the sub-folders named by the first field of each line")
    parser.add_argument("--key-scheme", choices=("relpath", "flat"), default="relpath")
    parser.add_argument("--workers", type=int, default=max(1, (os.cpu_count() or 2) // 2),
                        help="processes reading and encoding images")
    parser.add_argument("--compress-level", type=int, default=1, help="PNG compression level (KAIR: 1)")
    parser.add_argument("--overwrite", action="store_true", help="replace existing output LMDBs")
    args = parser.parse_args(argv)
    exts = tuple("." + e.lower().lstrip(".") for e in args.ext)
    jobs: list[tuple[str, str, list[str] | None]] = []
    if args.dataset:
        if args.input or args.output:
            parser.error("give either --dataset or --input/--output pairs")
        for candidates, output, use_list in PRESETS[args.dataset]:
            found = next((c for c in candidates if os.path.isdir(os.path.join(args.root, c))), None)
            if found is None:
                print(f"skip {output}: none of {[os.path.join(args.root, c) for c in candidates]} exists")
                continue
            folders = read_list(os.path.join(args.root, VIMEO_LIST)) if use_list else None
            jobs.append((os.path.join(args.root, found), os.path.join(args.root, output), folders))
        if not jobs:
            parser.error(f"no input folder of preset {args.dataset!r} under {args.root}")
    else:
        if not args.input or len(args.input) != len(args.output):
            parser.error("give --dataset, or as many --output as --input")
        folders = read_list(args.list) if args.list else None
        jobs = [(i, o, folders) for i, o in zip(args.input, args.output)]
    for _, out, _ in jobs:
        if os.path.exists(out) and not args.overwrite:
            parser.error(f"{out} already exists; remove it or pass --overwrite")
    for inp, out, folders in jobs:
        build(inp, out, exts, folders, args.key_scheme, args.workers, args.overwrite, args.compress_level)
    return 0


if __name__ == "__main__":
    sys.exit(main())
