"""Training-data loading speed: clips/s (and per worker) of VideoRecurrentTrainDataset, disk PNG vs LMDB.

Generates a small REDS-like dataset in a temporary folder (LQ 180x320, GT 720x1280 PNG frames with smooth
content plus noise, like real frames compress), packs it into LMDBs with ``create_lmdb``'s writer, then times
a DataLoader over each back-end at the V01 recipe's clip size (6 frames, GT crop 256 / LQ crop 64).

    python benchmarks/bench_data.py --workers 2 --iters 48
    python benchmarks/bench_data.py --cold --clips 20 --iters 12 --workers 1   # reads from the device
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import cv2
import numpy as np
import torch
from torch.utils.data import DataLoader

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..")))

from data.dataset_video_train import VideoRecurrentTrainDataset  # noqa: E402
from utils.utils_lmdb import make_lmdb_from_imgs  # noqa: E402


def make_frame(rng: np.random.Generator, h: int, w: int) -> np.ndarray:
    small = rng.integers(0, 256, (h // 32 + 2, w // 32 + 2, 3)).astype(np.uint8)
    img = cv2.resize(small, (w, h), interpolation=cv2.INTER_CUBIC).astype(np.int16)
    return np.clip(img + rng.integers(-6, 7, img.shape), 0, 255).astype(np.uint8)


def generate(root: str, clips: int, frames: int, png_level: int) -> dict:
    rng = np.random.default_rng(0)
    rels = []
    for c in range(clips):
        for sub in ("gt", "lq"):
            os.makedirs(os.path.join(root, sub, f"{c:03d}"), exist_ok=True)
        for t in range(frames):
            gt = make_frame(rng, 720, 1280)
            lq = cv2.resize(gt, (320, 180), interpolation=cv2.INTER_AREA)
            rel = f"{c:03d}/{t:08d}.png"
            cv2.imwrite(os.path.join(root, "gt", rel), gt, [cv2.IMWRITE_PNG_COMPRESSION, png_level])
            cv2.imwrite(os.path.join(root, "lq", rel), lq, [cv2.IMWRITE_PNG_COMPRESSION, png_level])
            rels.append(rel)
    for sub in ("gt", "lq"):
        make_lmdb_from_imgs(os.path.join(root, sub), os.path.join(root, f"{sub}.lmdb"), rels,
                            [r[:-4] for r in rels], n_thread=1, progress=False)
    meta = os.path.join(root, "meta.txt")
    with open(meta, "w") as f:
        f.writelines(f"{c:03d} {frames} (720,1280,3) 00000000\n" for c in range(clips))
    return {"meta_info_file": meta, "num_frame": 6, "gt_size": 256, "scale": 4, "filename_tmpl": "08d",
            "use_hflip": True, "use_rot": True, "val_partition": None}


def evict(root: str) -> None:
    """Drop every file under ``root`` from the page cache (flushed first), so the next pass reads from the device."""
    for dirpath, _, files in os.walk(root):
        for name in files:
            fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def time_loader(opt: dict, workers: int, iters: int, batch: int) -> float:
    ds = VideoRecurrentTrainDataset(opt)
    loader = DataLoader(ds, batch_size=batch, shuffle=True, num_workers=workers, drop_last=True,
                        persistent_workers=workers > 0, generator=torch.Generator().manual_seed(0))
    seen, it = 0, iter(loader)
    next(it)  # worker start-up and first batch are not timed
    start = time.perf_counter()
    while seen < iters:
        try:
            batch_ = next(it)
        except StopIteration:
            it = iter(loader)
            continue
        seen += batch_["L"].shape[0]
    return seen / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--iters", type=int, default=48, help="clips timed per back-end")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--clips", type=int, default=2)
    parser.add_argument("--frames", type=int, default=12)
    parser.add_argument("--png-level", type=int, default=3, help="PNG level of the disk frames (cv2 default 3)")
    parser.add_argument("--repeats", type=int, default=2, help="alternate disk/LMDB runs; the best is kept")
    parser.add_argument("--cold", action="store_true",
                        help="evict the dataset from the page cache before each run; needs --clips > --iters + "
                             "1 + 2 * --workers so that every timed clip is read once")
    args = parser.parse_args()
    if args.cold and args.clips <= args.iters + 1 + 2 * args.workers:
        parser.error(f"--cold needs --clips > --iters + 1 + 2 * --workers = {args.iters + 1 + 2 * args.workers}")
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as root:
        t0 = time.perf_counter()
        base = generate(root, args.clips, args.frames, args.png_level)
        print(f"generated {args.clips} clips x {args.frames} frames in {time.perf_counter() - t0:.1f} s")
        backends = {
            "disk": {**base, "dataroot_gt": os.path.join(root, "gt"), "dataroot_lq": os.path.join(root, "lq"),
                     "io_backend": {"type": "disk"}},
            "lmdb": {**base, "dataroot_gt": os.path.join(root, "gt.lmdb"),
                     "dataroot_lq": os.path.join(root, "lq.lmdb"), "io_backend": {"type": "lmdb"}},
        }
        best = {name: 0.0 for name in backends}
        for _ in range(args.repeats):
            for name, opt in backends.items():
                if args.cold:
                    evict(root)
                best[name] = max(best[name], time_loader(opt, args.workers, args.iters, args.batch))
    per = max(args.workers, 1)
    for name, rate in best.items():
        print(f"{name:5s}: {rate:7.2f} clips/s, {rate / per:6.2f} clips/s per worker "
              f"(workers={args.workers}, 6 frames, LQ crop 64 of 180x320, GT crop 256 of 720x1280, "
              f"{'cold' if args.cold else 'warm'} page cache)")
    print(f"lmdb / disk = {best['lmdb'] / best['disk']:.2f}x")


if __name__ == "__main__":
    main()
