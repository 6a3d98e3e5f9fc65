"""Merge the REDS validation clips into the training folders as clips 240..269 (KAIR/BasicSR's layout).

The training recipes read 270 clips (``data/meta_info/meta_info_REDS_GT.txt``) and hold out REDS4
(000, 011, 015, 020) through ``val_partition``. Pure Python (shutil), copies by default (``--move`` to move).

Example (from the repository root)::

    python scripts/data_preparation/regroup_reds_dataset.py --root trainsets/REDS
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys

from tqdm import tqdm

# (train folder, val folder) pairs relative to --root; the bicubic sets may sit in an X4 sub-folder
PAIRS = [("train_sharp", "val_sharp"), ("train_sharp_bicubic/X4", "val_sharp_bicubic/X4"),
         ("train_sharp_bicubic", "val_sharp_bicubic"), ("train_blur", "val_blur"),
         ("train_blur_bicubic/X4", "val_blur_bicubic/X4"), ("train_blur_bicubic", "val_blur_bicubic")]
OFFSET = 240


def regroup(train_path: str, val_path: str, move: bool = False) -> int:
    """Copy (or move) every ``val_path/NNN`` clip to ``train_path/{NNN + 240:03d}``; returns the count.

    Raises:
        ValueError: a validation clip name is not a number, or its target exists with other content.
    """
    clips = sorted(d for d in os.listdir(val_path) if os.path.isdir(os.path.join(val_path, d)))
    done = 0
    for clip in tqdm(clips, desc=f"{val_path} -> {train_path}", unit="clip"):
        if not clip.isdigit():
            raise ValueError(f"{os.path.join(val_path, clip)}: REDS clip folders are numbers (000..029)")
        dst = os.path.join(train_path, f"{int(clip) + OFFSET:03d}")
        src = os.path.join(val_path, clip)
        if os.path.exists(dst):
            if sorted(os.listdir(dst)) != sorted(os.listdir(src)):
                raise ValueError(f"{dst} exists with different frames than {src}; remove it and re-run")
            continue
        if move:
            shutil.move(src, dst)
        else:
            shutil.copytree(src, dst)
        done += 1
    return done


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--root", default="trainsets/REDS", help="folder holding train_* and val_* folders")
    parser.add_argument("--move", action="store_true", help="move instead of copy")
    args = parser.parse_args(argv)
    found = 0
    for train, val in PAIRS:
        tpath, vpath = os.path.join(args.root, train), os.path.join(args.root, val)
        if os.path.isdir(tpath) and os.path.isdir(vpath):
            if train + "/X4" in [p[0] for p in PAIRS] and os.path.isdir(os.path.join(tpath, "X4")):
                continue  # handled by the X4 pair
            n = regroup(tpath, vpath, args.move)
            print(f"{vpath} -> {tpath}: {n} clip(s) added")
            found += 1
    if not found:
        print(f"no train_*/val_* folder pair under {args.root}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
