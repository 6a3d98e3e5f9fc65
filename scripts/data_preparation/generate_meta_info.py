"""Write the clip lists (``meta_info_file``) the training datasets read, from frame folders.

Formats:

- ``clips`` (REDS, DVD, GoPro, DAVIS): ``clip nframes (h,w,c) start_frame`` per clip sub-folder, e.g.
  ``000 100 (720,1280,3) 00000000``; frames must be numbered consecutively (the start keeps its zero padding).
- ``vimeo``: ``clip/seq nframes (h,w,c)`` per septuplet, e.g. ``00001/0001 7 (256,448,3)``, in the order of
  ``--list`` (Vimeo's ``sep_trainlist.txt`` / ``sep_testlist.txt``) or of the folders found.

``--preset reds`` writes the REDS list (270 clips of 100 frames, REDS4 included: it is held out by
``val_partition``) without the data.

Examples (from the repository root)::

    python scripts/data_preparation/generate_meta_info.py --preset reds --output data/meta_info/meta_info_REDS_GT.txt
    python scripts/data_preparation/generate_meta_info.py --input trainsets/DVD/train_GT \
        --output data/meta_info/meta_info_DVD_train_GT.txt
    python scripts/data_preparation/generate_meta_info.py --format vimeo \
        --input trainsets/vimeo90k/vimeo_septuplet/sequences --list trainsets/vimeo90k/sep_trainlist.txt \
        --output data/meta_info/meta_info_Vimeo90K_train_GT.txt
"""

from __future__ import annotations

import argparse
import os
import sys

import cv2
from tqdm import tqdm

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))

from utils.utils_video import IMAGE_EXTENSIONS  # noqa: E402


def reds_lines() -> list[str]:
    """The REDS train+val list after ``regroup_reds_dataset.py``: clips 000..269, 100 frames of 720x1280."""
    return [f"{c:03d} 100 (720,1280,3) 00000000\n" for c in range(270)]


def _frames(folder: str) -> list[str]:
    return sorted(n for n in os.listdir(folder) if not n.startswith(".") and n.lower().endswith(IMAGE_EXTENSIONS))


def _shape(path: str) -> str:
    img = cv2.imread(path, cv2.IMREAD_UNCHANGED)
    if img is None:
        raise ValueError(f"cannot read image {path}")
    c = 1 if img.ndim == 2 else img.shape[2]
    return f"({img.shape[0]},{img.shape[1]},{c})"


def clip_lines(root: str) -> list[str]:
    """``clip nframes (h,w,c) start`` for every clip sub-folder of ``root`` (sorted).

    Raises:
        ValueError: a clip's frame names are not consecutive numbers (the clip and a gap are named).
    """
    lines, bad = [], []
    for clip in tqdm(sorted(d for d in os.listdir(root) if os.path.isdir(os.path.join(root, d))), unit="clip"):
        names = _frames(os.path.join(root, clip))
        if not names:
            continue
        stems = [os.path.splitext(n)[0] for n in names]
        if not all(s.isdigit() for s in stems):
            bad.append(f"{clip}: non-numeric frame name {next(s for s in stems if not s.isdigit())!r}")
            continue
        nums = [int(s) for s in stems]
        if nums != list(range(nums[0], nums[0] + len(nums))):
            gap = next(a for a, b in zip(nums, nums[1:]) if b != a + 1)
            bad.append(f"{clip}: frames not consecutive after {gap}")
            continue
        lines.append(f"{clip} {len(names)} {_shape(os.path.join(root, clip, names[0]))} {stems[0]}\n")
    if bad:
        raise ValueError(f"{len(bad)} clip(s) cannot be listed: {'; '.join(bad[:5])}")
    return lines


def vimeo_lines(root: str, seqs: list[str] | None) -> list[str]:
    """``clip/seq nframes (h,w,c)`` per sequence; the shape is read from the first sequence's first frame."""
    if seqs is None:
        seqs = sorted(f"{c}/{s}" for c in os.listdir(root) if os.path.isdir(os.path.join(root, c))
                      for s in os.listdir(os.path.join(root, c)) if os.path.isdir(os.path.join(root, c, s)))
    if not seqs:
        raise ValueError(f"no sequence under {root}")
    first = os.path.join(root, seqs[0])
    shape = _shape(os.path.join(first, _frames(first)[0]))
    lines, missing = [], []
    for seq in tqdm(seqs, unit="seq"):
        path = os.path.join(root, seq)
        if not os.path.isdir(path):
            missing.append(path)
            continue
        lines.append(f"{seq} {len(_frames(path))} {shape}\n")
    if missing:
        raise ValueError(f"{len(missing)} listed sequence(s) missing, e.g. {missing[:3]}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--preset", choices=("reds",), help="write a list that needs no data")
    parser.add_argument("--input", help="folder of clip (or Vimeo clip/seq) sub-folders")
    parser.add_argument("--format", choices=("clips", "vimeo"), default="clips")
    parser.add_argument("--list", help="Vimeo: sequence list (first field per line)")
    parser.add_argument("--output", required=True)
    parser.add_argument("--overwrite", action="store_true")
    args = parser.parse_args(argv)
    if os.path.exists(args.output) and not args.overwrite:
        parser.error(f"{args.output} exists; pass --overwrite")
    if args.preset == "reds":
        lines = reds_lines()
    elif not args.input or not os.path.isdir(args.input):
        parser.error("--input must be an existing folder (or use --preset)")
    elif args.format == "vimeo":
        seqs = None
        if args.list:
            with open(args.list) as f:
                seqs = [ln.split()[0] for ln in f if ln.strip()]
        lines = vimeo_lines(args.input, seqs)
    else:
        lines = clip_lines(args.input)
    os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
    with open(args.output, "w") as f:
        f.writelines(lines)
    print(f"wrote {len(lines)} lines to {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
