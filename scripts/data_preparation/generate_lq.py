"""Generate BI or BD x4 low-resolution frames from a folder tree of HR frames (no MATLAB needed).

Mirrors the input tree: every image under ``--input`` (recursively) is written as PNG under ``--output`` with the
same relative path. BI = MATLAB ``imresize(modcrop(img, 4), 1/4, 'bicubic')``; BD = Gaussian sigma 1.6 (12 taps,
replicate border) then every 4th pixel from the 2nd (see ``degradations.py``).

Examples (from the repository root)::

    python scripts/data_preparation/generate_lq.py --input trainsets/vimeo90k/vimeo_septuplet/sequences \
        --output trainsets/vimeo90k/vimeo_septuplet_matlabLRx4/sequences --degradation bi --workers 8
    python scripts/data_preparation/generate_lq.py --input trainsets/vimeo90k/vimeo_septuplet/sequences \
        --output trainsets/vimeo90k/vimeo_septuplet_BDLRx4/sequences --degradation bd --workers 8
    python scripts/data_preparation/generate_lq.py --input testsets/Vid4/GT --output testsets/Vid4/BDx4 \
        --degradation bd
"""

from __future__ import annotations

import argparse
import os
import sys
from multiprocessing import Pool

import cv2
from tqdm import tqdm

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))

from scripts.data_preparation.degradations import bd_degrade, bi_degrade, to_uint8  # noqa: E402
from utils.utils_video import IMAGE_EXTENSIONS, scandir  # noqa: E402

DEGRADATIONS = {"bi": bi_degrade, "bd": bd_degrade}


def degrade_file(job: tuple[str, str, str, int, bool]) -> str:
    """Degrade one image file; returns its output path (skips an existing output unless ``overwrite``)."""
    src, dst, kind, scale, overwrite = job
    if os.path.exists(dst) and not overwrite:
        return dst
    img = cv2.imread(src, cv2.IMREAD_COLOR)
    if img is None:
        raise ValueError(f"cannot read image {src}")
    out = to_uint8(DEGRADATIONS[kind](img, scale))
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    if not cv2.imwrite(dst, out):
        raise OSError(f"cannot write {dst}")
    return dst


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--input", required=True, help="folder of HR frames (searched recursively)")
    parser.add_argument("--output", required=True, help="output folder (same tree, PNG files)")
    parser.add_argument("--degradation", choices=sorted(DEGRADATIONS), default="bi")
    parser.add_argument("--scale", type=int, default=4)
    parser.add_argument("--workers", type=int, default=max(1, (os.cpu_count() or 2) // 2))
    parser.add_argument("--overwrite", action="store_true", help="recompute outputs that already exist")
    args = parser.parse_args(argv)
    if not os.path.isdir(args.input):
        parser.error(f"--input {args.input} is not a folder")
    if os.path.abspath(args.input) == os.path.abspath(args.output):
        parser.error("--output must differ from --input")
    rels = sorted(p for p in scandir(args.input, recursive=True) if p.lower().endswith(IMAGE_EXTENSIONS))
    if not rels:
        parser.error(f"no image under {args.input}")
    jobs = [(os.path.join(args.input, r), os.path.join(args.output, os.path.splitext(r)[0] + ".png"),
             args.degradation, args.scale, args.overwrite) for r in rels]
    bar = tqdm(total=len(jobs), unit="img", desc=f"{args.degradation.upper()}x{args.scale}")
    if args.workers > 1:
        with Pool(args.workers) as pool:
            for _ in pool.imap_unordered(degrade_file, jobs, chunksize=16):
                bar.update()
    else:
        for job in jobs:
            degrade_file(job)
            bar.update()
    bar.close()
    print(f"wrote {len(jobs)} {args.degradation.upper()} frames under {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
