"""Speed of a whole training item read from video files (data/dataset_video_file_train.py): seek and decode a random
clip of a real H.264 file with B-frames, convert the GT window to RGB, augment and degrade it. CPU ms per clip and
clips/s per loader worker on one thread, the decode alone (window-only RGB conversion against converting whole
frames, the former path), and optionally a real DataLoader.

The source videos are written first (``--videos`` files of ``--length`` frames at ``--size`` H W, libx264 CRF 18,
3 B-frames, a keyframe every ``--keyint`` frames: the re-encoding docs/realworld.md recommends; x264's default of 250
makes every clip decode up to 250 frames first). ``--frames 30`` is RVRT's real-world clip (GT 256), ``--frames 6``
VRT 001's. Items come from :class:`utils.utils_dataloader.SeededItems`, as in training.

    python benchmarks/bench_video_file_data.py --frames 6 30 --clips 12 --loader-workers 2
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from fractions import Fraction
from functools import partial
from itertools import islice

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")  # before NumPy loads its BLAS: one core per loader worker

import av  # noqa: E402
import cv2  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..")))

from data.dataset_video_file_train import VideoFileTrainDataset  # noqa: E402
from utils.utils_dataloader import SeededItems, build_train_loader  # noqa: E402


def write_videos(folder: str, count: int, length: int, size: tuple[int, int], keyint: int) -> None:
    """Textured, moving content (a panning noise texture with a drifting gradient), so B-frames predict."""
    height, width = size
    rng = np.random.default_rng(0)
    for k in range(count):
        texture = cv2.resize(rng.integers(0, 256, (height // 4 + 64, width // 4 + 64, 3), dtype=np.uint8),
                             (width + 256, height + 256), interpolation=cv2.INTER_CUBIC)
        with av.open(os.path.join(folder, f"video_{k:02d}.mp4"), "w") as container:
            stream = container.add_stream("libx264", rate=Fraction(25), options={
                "crf": "18", "x264-params": f"keyint={keyint}:min-keyint={keyint}:bframes=3:scenecut=0"})
            stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
            for t in range(length):
                frame = texture[2 * t:2 * t + height, 3 * t:3 * t + width]
                container.mux(stream.encode(av.VideoFrame.from_ndarray(np.ascontiguousarray(frame), format="rgb24")))
            container.mux(stream.encode(None))


def read_whole(reader, index, span: list[int], box: tuple[int, int, int, int]) -> list[np.ndarray]:
    """The former path: whole frames converted to RGB, then the window cut out."""
    top, left, h, w = box
    return [f[top:top + h, left:left + w].copy() for f in reader.read(index, span)]


def clocked(fn) -> tuple[float, float]:
    """``(CPU ms, wall ms)`` of one call (one thread: CPU time is the cost on a core of its own)."""
    cpu, wall = time.process_time(), time.perf_counter()
    fn()
    return 1000 * (time.process_time() - cpu), 1000 * (time.perf_counter() - wall)


def stats(values: list[float]) -> str:
    v = np.asarray(values)
    return f"{v.mean():7.1f} {np.median(v):7.1f} {np.percentile(v, 90):7.1f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--frames", type=int, nargs="+", default=[6, 30])
    parser.add_argument("--clips", type=int, default=12, help="items timed per setting")
    parser.add_argument("--videos", type=int, default=3)
    parser.add_argument("--length", type=int, default=150)
    parser.add_argument("--size", type=int, nargs=2, default=[720, 1280], metavar=("H", "W"))
    parser.add_argument("--keyint", type=int, default=24)
    parser.add_argument("--gt-size", type=int, default=256)
    parser.add_argument("--degradations", default="realbasicvsr")
    parser.add_argument("--loader-workers", type=int, default=0, help="also time a DataLoader with N workers")
    args = parser.parse_args()
    torch.set_num_threads(1)
    cv2.setNumThreads(1)

    with tempfile.TemporaryDirectory() as folder:
        t = time.perf_counter()
        write_videos(folder, args.videos, args.length, tuple(args.size), args.keyint)
        print(f"wrote {args.videos} H.264 videos of {args.length} frames {args.size[1]}x{args.size[0]} "
              f"(keyint {args.keyint}, 3 B-frames) in {time.perf_counter() - t:.1f} s")
        print("setting                         | item CPU ms mean median p90 | item wall ms | clips/s/worker | "
              "decode+window CPU ms | decode+whole-frame RGB CPU ms")
        for frames in args.frames:
            opt = {"dataroot_gt": folder, "num_frame": frames, "gt_size": args.gt_size, "scale": 4,
                   "degradations": args.degradations, "clips_per_video": args.clips, "use_hflip": True,
                   "use_rot": True, "index_dir": os.path.join(folder, "index")}
            ds = VideoFileTrainDataset(opt)
            items = SeededItems(ds, 0)
            items[(0, 0)]  # containers opened, caches warm
            cpu, wall = zip(*(clocked(partial(items.__getitem__, (1, i))) for i in range(args.clips)))
            # the decode alone: the same clips, window-only conversion against whole frames then cropped
            gt_index = ds.videos[0][0]
            rng = np.random.default_rng(frames)
            window, whole = [], []
            for _ in range(max(4, args.clips // 2)):
                start = int(rng.integers(0, gt_index.num_frames - frames + 1))
                top = int(rng.integers(0, gt_index.height - args.gt_size + 1))
                left = int(rng.integers(0, gt_index.width - args.gt_size + 1))
                span, box = list(range(start, start + frames)), (top, left, args.gt_size, args.gt_size)
                window.append(clocked(partial(ds.reader.read, gt_index, span, box))[0])
                whole.append(clocked(partial(read_whole, ds.reader, gt_index, span, box))[0])
            print(f"{frames:2d} frames, GT {args.gt_size}, {args.degradations:13s} | {stats(list(cpu))} | "
                  f"{np.mean(wall):7.1f} | {1000 / np.mean(cpu):6.2f} | {stats(window)} | {stats(whole)}")
            if args.loader_workers:
                batch = 2
                loader, sampler = build_train_loader(
                    ds, {"dataloader_batch_size": batch, "dataloader_num_workers": args.loader_workers},
                    rank=0, world_size=1, seed=0, accum_steps=1, pin_memory=False)
                sampler.set_epoch(0)
                count, t = 0, time.perf_counter()  # from the workers' start: no prefetched batch is free
                for got in islice(loader, max(1, args.clips * args.videos // batch)):
                    count += got["L"].shape[0]
                elapsed = time.perf_counter() - t
                print(f"   DataLoader, {args.loader_workers} workers, batch {batch}: {count} clips in {elapsed:.1f} s "
                      f"= {count / elapsed:.2f} clips/s (wall, on this machine's cores)")
                del loader


if __name__ == "__main__":
    main()
