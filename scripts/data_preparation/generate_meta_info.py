"""Write the clip lists (``meta_info_file``) the training datasets read, from frame folders.

The listing itself is :mod:`data.meta_info`'s, which also writes a missing list on first use (DAVIS, DVD, GoPro,
Vimeo-90K from its LMDB or with its split list). Formats:

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

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))

from data.meta_info import clip_lines, vimeo_lines  # noqa: E402


def reds_lines() -> list[str]:
    """The REDS train+val list after ``regroup_reds_dataset.py``: clips 000..269, 100 frames of 720x1280."""
    return [f"{c:03d} 100 (720,1280,3) 00000000\n" for c in range(270)]


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
