"""Training straight from video files: random clips of a folder (or list file) of videos read with PyAV, no frame
extraction.

Each video is indexed once (:mod:`data.video_frame_index`: frame timestamps and keyframes, cached beside the run,
or beside the data for a dataset built on its own, and rebuilt when a file changes), so a clip is read by seeking
to the keyframe before it and decoding forward; only the GT crop of each frame is converted to RGB.
Clips never cross a file's end, nor, with ``scene_cut_threshold``, a scene cut. The GT clip is cropped and
augmented, then degraded into the LQ (``degradations``, else x``scale`` bicubic), or read from paired LQ videos
(``dataroot_lq``), or made noisy for non-blind denoising (``denoise``).

Items: ``{'L': (T, C, gt_size // scale, gt_size // scale), 'H': (T, 3, gt_size, gt_size), 'key': '<stem>/<start>'}``
float32 RGB in [0, 1] (C = 4 with ``denoise``: the noise-level map is channel 4, ``L`` not clipped). Random draws
use the module RNGs, which the trainer seeds per item (:class:`utils.utils_dataloader.SeededItems`), so an item is
the same in any process or loader worker.
"""

from __future__ import annotations

import logging
import os
import random
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from data.data_roots import nearest_existing, writes_synthetic
from data.dataset_options import AUGMENT, NOISE_RANGE, RGB_CHANNELS, at_least, resolve_options
from data.dataset_synthetic import bicubic_downsample
from data.degradation_pipeline import DEGRADATION_OPTIONS, build_degradation
from data.synthetic_videos import SYNTHESIZE_DEFAULTS, refuse_synthesize, synthesize_videos
from data.video_frame_index import (
    INDEX_DIR_NAME,
    RUN_INDEX_DIR,
    FrameIndex,
    VideoClipReader,
    default_index_dir,
    load_index,
)
from utils import utils_dist, utils_video
from utils.utils_option_schema import OPT_INT, OPT_NUM, OPT_STR, REQUIRED, Opt
from utils.utils_video import DataCheckError
from utils.utils_video_clips import VIDEO_EXTENSIONS, is_video_file, list_videos
from utils.utils_video_file import VideoFileError

logger = logging.getLogger(__name__)

__all__ = ["VideoFileTrainDataset"]

_READ_ERRORS = (VideoFileError, OSError)


def _refuse_intervals(value: list) -> str | None:
    ok = value and all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in value)
    return None if ok else "must be a non-empty list of integers >= 1"


class VideoFileTrainDataset(Dataset):
    """Random clips of ``num_frame`` frames from video files, cropped to ``gt_size`` and degraded on the fly.

    The videos are the files with a video extension directly inside the folder ``dataroot_gt`` (sorted), the
    files a list file names (one path a line, relative to the list's folder; blank lines and ``#`` comments
    skipped), or one video file. An epoch is one item per frame of every usable video (the item's clip starts at
    that frame, or at a random valid start when it would cross the file's end or a scene cut), or
    ``clips_per_video`` items per video at random starts.

    Files that are empty, unreadable, not videos, too short for a clip, smaller than ``gt_size``, or whose paired
    LQ video is missing or does not match are listed in one warning when the dataset is built and skipped
    (``strict``: one error instead). A file that fails later, mid-run, is logged and its item taken from the next
    usable video, so a run never stops on one bad file.

    Under ``torch.distributed``, rank 0 writes the synthetic videos (``synthesize_if_missing``) and builds the
    index caches first; the other ranks then read them.

    Args:
        opt: the keys of :attr:`OPTIONS` (plus the common dataset keys); not modified.

    Raises:
        utils.utils_option.OptionError: an unknown key, a wrong type or an unsupported value.
        utils.utils_video.DataCheckError: no usable video, or (``strict``) any bad file, naming each.
        ValueError: inconsistent options (``gt_size`` not a multiple of ``scale``, ``denoise`` with ``scale > 1``).
    """

    OPTIONS: dict[str, Opt] = {
        "n_channels": RGB_CHANNELS,
        "dataroot_gt": Opt(str, REQUIRED, "GT videos: a folder (the files with a video extension directly inside "
                           f"it: {', '.join(VIDEO_EXTENSIONS)}), a list file (one path a line, relative to its "
                           "folder) or one video file."),
        "dataroot_lq": Opt(OPT_STR, None, "Paired LQ videos: a folder holding each GT video's LQ under the same "
                           "relative path, with the same frames at 1/`scale` of the size (null: the LQ is made from "
                           "the GT crop)."),
        "scale": Opt(int, 4, "Upscaling factor: LQ frames are 1/scale of the GT size (default: the top-level "
                     "`scale`; 4 for a dataset built directly).", refuse=at_least(1)),
        "num_frame": Opt(int, REQUIRED, "Frames per training clip.", refuse=at_least(1)),
        "interval_list": Opt(list, [1], "Temporal strides; each item draws one at random.",
                             refuse=_refuse_intervals),
        "random_reverse": Opt(bool, False, "Reverse the frame order of a clip with probability 0.5."),
        "gt_size": Opt(int, 256, "Side of the square GT crop in pixels (the same place in every frame); the LQ is "
                       "`gt_size // scale`.", refuse=at_least(1)),
        **AUGMENT,
        "clips_per_video": Opt(OPT_INT, None, "Epoch length: null gives one item per frame of every video (long "
                               "videos weigh more, as frame folders do); N gives N items per video, each at a random "
                               "start (every video weighs the same).", refuse=at_least(1)),
        "scene_cut_threshold": Opt(OPT_NUM, None, "Avoid clips that straddle a scene cut: a frame whose colour "
                                   "histogram differs from the previous one's by more than this (0..1; 0.3 catches "
                                   "hard cuts) starts a new scene. Scoring decodes each video once (cached). null: "
                                   "off.", refuse=at_least(0)),
        "index_dir": Opt(OPT_STR, None, "Folder of the frame-index cache (JSON per video, checked against the file's "
                         f"size and mtime). null: beside the run, `experiments/<task>/{RUN_INDEX_DIR}/`, when "
                         f"training builds the dataset; a dataset built on its own uses `{INDEX_DIR_NAME}/` in the GT "
                         "videos' folder when writable, else `$XDG_CACHE_HOME/vrt/video_index` (`~/.cache/...`)."),
        "strict": Opt(bool, False, "Fail on any bad video file instead of skipping it (the message lists each file "
                      "and why)."),
        "check_data": Opt(bool, True, "When a video is indexed, decode its first and last frame (the last by "
                          "seeking), so a broken file is listed at start-up; cached with the index."),
        "denoise": Opt(bool, False, "Non-blind denoising: L = GT + N(0, sigma) (not clipped) with one sigma ~ "
                       "U[sigma_min, sigma_max] / 255 per clip, and the sigma map as channel 4; needs `scale` 1."),
        **NOISE_RANGE,
        **DEGRADATION_OPTIONS,
        "synthesize_if_missing": Opt((dict, type(None)), None, "When `dataroot_gt` does not exist and is the folder "
                                     "this names as `root`, write synthetic H.264 GT videos there first (rank 0, "
                                     "atomically): `{\"root\": \"trainsets/demo\", \"num_videos\": 4, "
                                     "\"num_frames\": 60, \"size\": [256, 256], \"seed\": 0}` (`root` is "
                                     "required; missing other keys take these values). A `dataroot_gt` other than "
                                     "`root` (e.g. a misspelt folder of your videos) is never written: a missing "
                                     "one is an error naming the nearest existing folder. null: never write.",
                                     refuse=refuse_synthesize),
    }
    # keys that training points into the run's folder when the option file leaves them null
    # (data.select_dataset.define_Dataset(..., run_dir=experiments/<task>))
    RUN_FOLDERS: dict[str, str] = {"index_dir": RUN_INDEX_DIR}

    def __init__(self, opt: dict[str, Any]) -> None:
        super().__init__()
        self.opt = opt = resolve_options(type(self), opt)
        name = type(self).__name__
        self.scale, self.gt_size, self.num_frame = opt["scale"], opt["gt_size"], opt["num_frame"]
        self.interval_list = list(opt["interval_list"])
        self.random_reverse = opt["random_reverse"]
        self.use_hflip, self.use_rot = opt["use_hflip"], opt["use_rot"]
        self.denoise = opt["denoise"]
        self.sigma_range = (opt["sigma_min"] / 255.0, opt["sigma_max"] / 255.0)
        spec = opt["degradations"]
        if self.denoise and (self.scale != 1 or spec or opt["dataroot_lq"]):
            raise ValueError(f"{name}: denoise restores noisy frames at their size; set scale 1 and leave "
                             "degradations and dataroot_lq unset")
        if self.denoise and self.sigma_range[0] > self.sigma_range[1]:
            raise ValueError(f"{name}: need sigma_min <= sigma_max, got {opt['sigma_min']}, {opt['sigma_max']}")
        if spec and opt["dataroot_lq"]:
            raise ValueError(f"{name}: give either dataroot_lq (paired LQ videos) or degradations, not both")
        if not opt["dataroot_lq"] and self.gt_size % self.scale:
            raise ValueError(f"{name}: gt_size {self.gt_size} must be a multiple of scale {self.scale}")
        self.degradation = build_degradation(spec, self.scale) if spec else None
        self.threshold = opt["scene_cut_threshold"]
        self.span = (self.num_frame - 1) * max(self.interval_list) + 1

        root = opt["dataroot_gt"]
        if writes_synthetic(opt):
            spec = {k: v for k, v in opt["synthesize_if_missing"].items() if k != "root"}
            _rank0_first(lambda: synthesize_videos(root, {**SYNTHESIZE_DEFAULTS, **spec}))
        if not os.path.exists(root):
            raise DataCheckError(f"{name}: dataroot_gt {root} does not exist (nearest existing folder: "
                                 f"{nearest_existing(root)})")
        self.index_dir = opt["index_dir"] or default_index_dir(root)
        self.reader = VideoClipReader()
        self.stats = {"indexed": 0, "cached": 0}
        _rank0_first(lambda: self._scan(report=True), lambda: self._scan(report=False))

        counts = np.array([ix.num_frames for ix, _ in self.videos], dtype=np.int64)
        self.per_frame = opt["clips_per_video"] is None
        per_video = counts if self.per_frame else np.full(len(counts), opt["clips_per_video"])
        self._offsets = np.concatenate([[0], np.cumsum(per_video)])  # items of video v: offsets[v]..offsets[v+1]-1
        self._failed: set[str] = set()
        lq = "paired LQ videos" if opt["dataroot_lq"] else ("noise" if self.denoise else
                                                             "degradations" if spec else f"bicubic x{self.scale}")
        logger.info("%s: %d videos (%d frames), %d items per epoch, LQ from %s; frame index in %s (%d built, %d "
                    "from cache)", name, len(self.videos), int(counts.sum()), len(self), lq, self.index_dir,
                    self.stats["indexed"], self.stats["cached"])

    # ---------------------------------------------------------------------------------------------- start-up
    def _list(self) -> list[tuple[str, str | None]]:
        """``[(gt path, lq path or None)]``."""
        root, lq_root = self.opt["dataroot_gt"], self.opt["dataroot_lq"]
        if os.path.isdir(root):
            files, base = list_videos(root), root
        elif is_video_file(root):
            files, base = [root], os.path.dirname(root)
        else:
            base = os.path.dirname(root)
            try:
                with open(root) as f:
                    lines = [ln.strip() for ln in f]
            except (OSError, UnicodeDecodeError) as e:
                raise DataCheckError(f"{type(self).__name__}: dataroot_gt {root} is neither a folder, a video nor a "
                                     f"readable list file ({e})") from e
            files = [os.path.join(base, ln) for ln in lines if ln and not ln.startswith("#")]
        if not files:
            raise DataCheckError(f"{type(self).__name__}: no video file ({', '.join(VIDEO_EXTENSIONS)}) in {root}")
        if not lq_root:
            return [(f, None) for f in files]
        pairs = []
        for f in files:
            relative = os.path.relpath(f, base or ".")
            pairs.append((f, os.path.join(lq_root, os.path.basename(f) if relative.startswith("..") else relative)))
        return pairs

    def _scan(self, report: bool) -> None:
        """Index every video (cache first), keep the usable ones in ``self.videos``, report the others."""
        name, check, scene = type(self).__name__, self.opt["check_data"], self.threshold is not None
        self.videos: list[tuple[FrameIndex, FrameIndex | None]] = []
        self._cuts: list[np.ndarray | None] = []
        problems = []
        entries = self._list()
        for gt_path, lq_path in entries:
            lq, cuts, why = None, None, None
            try:
                gt = self._index(gt_path, scene, check)
                cuts = self._cut_counts(gt)
            except VideoFileError as e:
                why = str(e).removeprefix(f"{gt_path}: ")
            if lq_path and not why:
                try:
                    lq = self._index(lq_path, False, check)
                except VideoFileError as e:
                    why = f"its LQ {e}"
            why = why or self._unusable(gt, lq, cuts)
            if why:
                problems.append(f"{gt_path}: {why}")
                continue
            self.videos.append((gt, lq))
            self._cuts.append(cuts)
        if problems and (self.opt["strict"] or not self.videos):
            why = "strict is set" if self.opt["strict"] else "none is usable"
            raise DataCheckError(f"{name}: {len(problems)} of {len(entries)} video file(s) are unusable and {why}: "
                                 + "; ".join(problems))
        if problems and report:
            logger.warning("%s: skipping %d of %d video file(s): %s", name, len(problems), len(entries),
                           "; ".join(problems))

    def _index(self, path: str, scene: bool, check: bool) -> FrameIndex:
        index, built = load_index(path, self.index_dir, scene_diff=scene, check=check)
        self.stats["indexed" if built else "cached"] += 1
        return index

    def _cut_counts(self, index: FrameIndex) -> np.ndarray | None:
        """Cumulative count of scene cuts at frames ``0..t`` (``None``: no scene-cut avoidance)."""
        if self.threshold is None or index.scene_diff is None:
            return None
        return np.cumsum(index.scene_diff > self.threshold)

    def _unusable(self, gt: FrameIndex, lq: FrameIndex | None, cuts: np.ndarray | None) -> str | None:
        if gt.num_frames < self.span:
            return f"{gt.num_frames} frames, fewer than a clip's {self.span} (num_frame x max interval)"
        if cuts is not None and not len(_valid_starts(gt.num_frames, cuts, self.span)):
            return f"no stretch of {self.span} frames without a scene cut (scene_cut_threshold {self.threshold})"
        if min(gt.height, gt.width) < self.gt_size:
            return f"{gt.width}x{gt.height} frames, smaller than gt_size {self.gt_size}"
        if lq is not None:
            if lq.num_frames != gt.num_frames:
                return f"its LQ {lq.path} has {lq.num_frames} frames, the GT {gt.num_frames}"
            if (lq.width * self.scale, lq.height * self.scale) != (gt.width, gt.height):
                return f"its LQ {lq.path} is {lq.width}x{lq.height}, not 1/{self.scale} of {gt.width}x{gt.height}"
        return None

    # ---------------------------------------------------------------------------------------------- items
    def __len__(self) -> int:
        return int(self._offsets[-1])

    def _start(self, video: int, frame: int, span: int, pick: random.Random) -> int:
        """``frame`` when a clip of ``span`` frames may start there (``-1``: never), else a random valid start."""
        count, cuts = self.videos[video][0].num_frames, self._cuts[video]
        if cuts is None:
            return frame if 0 <= frame <= count - span else pick.randrange(count - span + 1)
        starts = _valid_starts(count, cuts, span)
        at = int(np.searchsorted(starts, frame))
        if frame >= 0 and at < len(starts) and starts[at] == frame:
            return frame
        return int(starts[pick.randrange(len(starts))])

    def __getitem__(self, index: int) -> dict[str, Any]:
        if not 0 <= index < len(self):
            raise IndexError(f"{type(self).__name__}: index {index} out of range [0, {len(self)})")
        video = int(np.searchsorted(self._offsets, index, side="right")) - 1
        first = index - int(self._offsets[video]) if self.per_frame else -1
        # one draw from the item's seeded stream; each attempt (video) then draws its clip from its own generator,
        # so the item is the same in a process that has not yet seen a file fail as in one that has
        base = random.getrandbits(64)
        for attempt in range(len(self.videos)):
            v = (video + attempt) % len(self.videos)
            gt_index, lq_index = self.videos[v]
            if gt_index.path in self._failed:
                continue
            pick = random.Random(f"{base}/{attempt}")
            interval = pick.choice(self.interval_list)
            start = self._start(v, first if v == video else -1, (self.num_frame - 1) * interval + 1, pick)
            frames = list(range(start, start + self.num_frame * interval, interval))
            if self.random_reverse and pick.random() < 0.5:
                frames = frames[::-1]
            # unpaired: the GT window is drawn here and only it is converted to RGB (the same bits, far faster)
            crop = None if lq_index is not None else (pick.randint(0, gt_index.height - self.gt_size),
                                                      pick.randint(0, gt_index.width - self.gt_size),
                                                      self.gt_size, self.gt_size)
            try:
                gts = self.reader.read(gt_index, frames, crop)
                lqs = self.reader.read(lq_index, frames) if lq_index is not None else None
            except _READ_ERRORS as e:
                self._failed.add(gt_index.path)
                logger.warning("%s: %s; its items come from the next video from now on", type(self).__name__, e)
                continue
            key = f"{os.path.splitext(os.path.basename(gt_index.path))[0]}/{start:08d}"
            lq, gt = self._make(gts, lqs, key)
            return {"L": lq, "H": gt, "key": key}
        raise DataCheckError(f"{type(self).__name__}: no video can be read any more (see the warnings above)")

    def _make(self, gts: list[np.ndarray], lqs: list[np.ndarray] | None, key: str) -> tuple[torch.Tensor,
                                                                                         torch.Tensor]:
        """Crop (paired LQ/GT; the GT alone comes cropped), augment and degrade RGB uint8 ``(H, W, 3)`` frames ->
        ``(L (T, C, h, w), H (T, 3, H, W))``."""
        if lqs is not None:
            gts, lqs = utils_video.paired_random_crop(gts, lqs, self.gt_size, self.scale, key)
            out = utils_video.augment(lqs + gts, self.use_hflip, self.use_rot)
            return _to_tensor(np.stack(out[:len(lqs)])), _to_tensor(np.stack(out[len(lqs):]))
        clip = np.stack(utils_video.augment(gts, self.use_hflip, self.use_rot))  # (T, H, W, 3) uint8
        if self.degradation is not None:
            rng = np.random.default_rng(np.random.randint(2**32, dtype=np.uint64))  # from the item's seeded state
            return _to_tensor(self.degradation(clip, rng)), _to_tensor(clip)
        gt = _to_tensor(clip)
        if self.denoise:
            level = torch.empty((1, 1, 1, 1)).uniform_(*self.sigma_range)
            noise = torch.normal(mean=0.0, std=level.expand_as(gt))
            t, _, h, w = gt.shape
            return torch.cat([gt + noise, level.expand(t, 1, h, w)], dim=1), gt
        return bicubic_downsample(gt, self.scale), gt


def _to_tensor(frames: np.ndarray) -> torch.Tensor:
    """``(T, H, W, 3)`` uint8 or float in [0, 1] -> ``(T, 3, H, W)`` float32."""
    out = torch.from_numpy(np.ascontiguousarray(frames.transpose(0, 3, 1, 2)))
    return out.float().div_(255.0) if out.dtype == torch.uint8 else out.float()


def _valid_starts(num_frames: int, cuts: np.ndarray | None, span: int) -> np.ndarray:
    """Starts ``s`` whose frames ``s..s + span - 1`` lie in the file and, given the cumulative cut counts
    ``cuts``, in one scene (no cut at ``s + 1..s + span - 1``). Sorted int64."""
    starts = np.arange(max(num_frames - span + 1, 0), dtype=np.int64)
    if cuts is None or not len(starts):
        return starts
    return starts[cuts[starts + span - 1] == cuts[starts]]


def _rank0_first(lead: Any, follow: Any = None) -> None:
    """Rank 0 writes (synthetic videos, index caches) first, then the other ranks read; an error on rank 0 stops
    every rank (the others with ``DataCheckError('on rank 0: <type>: <text>')``)."""
    utils_dist.rank0_first(lead, follow, raise_as=lambda name, text: DataCheckError(f"on rank 0: {name}: {text}"))
