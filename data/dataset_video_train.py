"""Training datasets of the VRT/RVRT recipes (KAIR names and option keys; reference sampling and augmentation).

Items: ``{'L': (T, C, h, w), 'H': (T', 3, H, W), 'key': str}``, float32 RGB in [0, 1] (C = 4 for non-blind
denoising: the noise-level map is channel 4). Randomness comes from the module RNGs (``random`` for sampling,
crop and flips, ``torch`` for noise and colour jitter), which the trainer seeds per item; a dataset never
reseeds them. Each class's ``OPTIONS`` lists the keys it takes (type, default, meaning); its option dict is
checked and completed against them when it is built (:mod:`data.dataset_options`), never modified.

Differences from KAIR (fixes): ``val_partition`` is held out whatever the dataset's ``name``; ``num_frame: -1``
means all 7 Vimeo frames; Vimeo ``random_reverse`` does not mutate state; every file / key is checked when the
dataset is built (one error naming the first offenders), and a sample of frames is decoded.
"""

from __future__ import annotations

import logging
import random
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset
from torchvision import transforms

from data.dataset_options import AUGMENT, NOISE_RANGE, RGB_CHANNELS, at_least, only, resolve_options
from data.meta_info import ensure_meta_info
from utils import utils_video
from utils.utils_option_schema import OPT_STR, REQUIRED, Opt
from utils.utils_video import DataCheckError, FrameStore, check_problems

logger = logging.getLogger(__name__)

__all__ = [
    "VAL_PARTITIONS",
    "VideoRecurrentTrainDataset",
    "VideoRecurrentTrainNonblindDenoisingDataset",
    "VideoRecurrentTrainVimeoDataset",
    "VideoRecurrentTrainVimeoVFIDataset",
    "read_meta_info",
    "read_meta_lines",
]

VAL_PARTITIONS = {"REDS4": ("000", "011", "015", "020"), "official": tuple(f"{v:03d}" for v in range(240, 270))}
_NO_PARTITION = (None, "", "none", "None")


def read_meta_lines(path: str) -> list[str]:
    """The stripped lines of a ``meta_info_file``.

    Raises:
        DataCheckError: the file cannot be read (a missing one says which script writes it).
    """
    try:
        with open(path) as f:
            return [ln.strip() for ln in f]
    except OSError as err:
        hint = ("; write it with scripts/data_preparation/generate_meta_info.py (docs/datasets.md)"
                if isinstance(err, FileNotFoundError) else "")
        raise DataCheckError(f"meta_info_file {path} cannot be read: {err.strerror or err}{hint}") from err


def read_meta_info(path: str, fields: int) -> list[tuple[str, int, int]]:
    """Parse a clip list: ``clip nframes (h,w,c) [start_frame]`` per line -> ``[(clip, nframes, start)]``.

    Args:
        fields: 4 (REDS/DVD/GoPro/DAVIS lists: the start frame is required) or 3 (Vimeo: start is 0).

    Raises:
        DataCheckError: the file is missing or a line is malformed (the line is quoted).
    """
    lines = read_meta_lines(path)
    out, bad = [], []
    for num, line in enumerate(lines, 1):
        if not line:
            continue
        parts = line.split()
        try:
            if len(parts) < fields:
                raise ValueError
            out.append((parts[0], int(parts[1]), int(parts[3]) if fields >= 4 else 0))
        except ValueError:
            bad.append(f"line {num}: {line!r}")
    what = "'clip nframes (h,w,c) start_frame'" if fields >= 4 else "'clip/seq nframes (h,w,c)'"
    check_problems(bad, f"meta_info_file {path} (expected {what} per line)")
    if not out:
        raise DataCheckError(f"meta_info_file {path} lists no clip")
    return out


def _partition(value: str | list | None) -> tuple[str, ...]:
    """The clip names held out by a (valid) ``val_partition`` value."""
    if value in _NO_PARTITION:
        return ()
    if isinstance(value, list):
        return tuple(str(v) for v in value)
    return VAL_PARTITIONS[value]


def _refuse_partition(value: Any) -> str | None:
    if value in _NO_PARTITION or isinstance(value, list) or value in VAL_PARTITIONS:
        return None
    return f"use one of {sorted(VAL_PARTITIONS)}, a list of clip names, or null"


def _refuse_intervals(value: list) -> str | None:
    ok = value and all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in value)
    return None if ok else "must be a non-empty list of integers >= 1"


def _refuse_backend(value: dict) -> str | None:
    if list(value) == ["type"] and value["type"] in ("disk", "lmdb"):
        return None
    return 'must be {"type": "disk"} (frame folders) or {"type": "lmdb"} (memcached is not supported)'


def _refuse_vimeo_frames(value: int) -> str | None:
    return None if value == -1 or 1 <= value <= 7 else "a Vimeo septuplet has 7 frames: use 1..7, or -1 for all"


def _check_roots(stores: list[FrameStore], what: str) -> None:
    for store in stores:
        if not store.exists():
            kind = "LMDB folder (with data.mdb)" if store.backend == "lmdb" else "folder"
            raise DataCheckError(f"{what}: {kind} {store.root} does not exist")


def _check_keys(store: FrameStore, keys: list[str], what: str, hint: str = "") -> None:
    """Every key exists in ``store`` (cheap: no decoding), else one error naming the first missing ones."""
    check_problems(store.missing(keys), f"{what}: missing frames in {store.root}{hint}")


def _check_decodes(entries: list[tuple[FrameStore, int, list[str]]], samples: int, what: str) -> None:
    """Decode up to ``samples`` aligned keys (spread evenly) of every store and compare their sizes.

    Args:
        entries: ``(store, scale, keys)``; ``keys[i]`` of every entry belong to the same clip, and a frame of
            an entry is ``scale / scale_0`` times the size of the first entry's.
    """
    count = len(entries[0][2])
    if samples > 0 and count:
        picks = sorted(set(np.linspace(0, count - 1, min(samples, count)).round().astype(int).tolist()))
        problems, sizes = [], []
        for store, _, keys in entries:
            got = {}
            for i in picks:
                try:
                    got[i] = store.get(keys[i]).shape[:2]
                except DataCheckError as err:
                    problems.append(str(err))
            sizes.append(got)
        check_problems(problems, f"{what}: unreadable frames")
        base_store, base_scale, base_keys = entries[0]
        for (store, scale, keys), got in zip(entries[1:], sizes[1:]):
            for i, shape in got.items():
                ref = sizes[0][i]
                want = (ref[0] * scale // base_scale, ref[1] * scale // base_scale)
                if tuple(shape) != want:
                    problems.append(f"{store.locate(keys[i])} is {tuple(shape)}, expected {want} "
                                    f"({scale // base_scale}x {base_store.locate(base_keys[i])})")
        check_problems(problems, f"{what}: LQ/GT size mismatch")
    FrameStore.close_all()  # the DataLoader workers re-open the LMDBs themselves


# options of every training set that crops and augments stored clips (REDS-style and Vimeo)
_CLIP_OPTIONS: dict[str, Opt] = {
    "n_channels": RGB_CHANNELS,
    "scale": Opt(int, 4, "Upscaling factor: LQ frames are 1/scale of the GT size (default: the top-level `scale`; "
                 "4 for a dataset built directly).", refuse=at_least(1)),
    "io_backend": Opt(dict, {"type": "disk"}, 'Storage of `dataroot_gt`/`dataroot_lq`: `{"type": "lmdb"}` (LMDBs '
                      'made by KAIR\'s, BasicSR\'s or our `create_lmdb.py`) or `{"type": "disk"}` (frame folders).',
                      refuse=_refuse_backend),
    "filename_ext": Opt(str, "png", "Frame file extension with the disk backend (LMDB keys have none)."),
    "gt_size": Opt(int, 256, "Side of the square GT crop in pixels; the LQ crop is `gt_size // scale`, at the "
                   "same place in every frame.", refuse=at_least(1)),
    "random_reverse": Opt(bool, False, "Reverse the frame order of a clip with probability 0.5."),
    **AUGMENT,
    "check_data": Opt(bool, True, "Check when the dataset is built that every frame exists and decode a sample "
                      "(one error naming the first missing or unreadable files); false skips both."),
    "check_decode_samples": Opt(int, 64, "Frames per store that `check_data` decodes (spread evenly over the "
                                "clips, LQ/GT sizes compared); 0: existence only.", refuse=at_least(0)),
}
# Vimeo-90K septuplets, training and test
VIMEO_FRAME_OPTIONS: dict[str, Opt] = {
    "num_frame": Opt(int, -1, "Centred frames taken of the septuplet's 7 (-1: all 7, as in RVRT's files).",
                     refuse=_refuse_vimeo_frames),
    "temporal_scale": Opt(int, 1, "Keep every n-th of those frames (2 with num_frame 7: im1, im3, im5, im7).",
                          refuse=at_least(1)),
    "pad_sequence": Opt(bool, False, "Repeat the last frame once (7 -> 8 frames: a whole VRT window of 8)."),
    "mirror_sequence": Opt(bool, False, "Append the time-reversed clip (7 -> 14 frames, as RVRT trains); in "
                           "training it replaces `pad_sequence`."),
}


class VideoRecurrentTrainDataset(Dataset):
    """Clips of ``num_frame`` frames from REDS / DVD / GoPro / DAVIS-style folders or LMDBs (SR and deblurring).

    One item per frame listed in ``meta_info_file`` (``clip nframes (h,w,c) start_frame``); the item's clip
    starts at that frame (re-drawn inside the clip when too close to its end), then the reference's random
    reverse, paired crop (``gt_size`` in GT, ``gt_size // scale`` in LQ) and shared flips.

    Args:
        opt: the keys of :attr:`OPTIONS` (plus the common dataset keys); not modified.

    Raises:
        utils.utils_option.OptionError: an unknown key, a wrong type or an unsupported value.
        utils.utils_video.DataCheckError: missing or unreadable files (the first ones named).

    Item: ``{'L': (T, 3, gt_size/scale, gt_size/scale), 'H': (T, 3, gt_size, gt_size), 'key': 'clip/frame'}``.
    """

    OPTIONS: dict[str, Opt] = {
        **_CLIP_OPTIONS,
        "dataroot_gt": Opt(str, REQUIRED, "GT frames: an LMDB with keys `<clip>/<frame>` or a folder of "
                           "`<clip>/<frame>.<filename_ext>`."),
        "dataroot_lq": Opt(str, REQUIRED, "LQ frames, laid out like `dataroot_gt` (bicubic x4 frames for SR, "
                           "blurred frames for deblurring)."),
        "meta_info_file": Opt(str, REQUIRED, "Clip list, one `clip nframes (h,w,c) start_frame` line per clip "
                              "(`data/meta_info/`, or `scripts/data_preparation/generate_meta_info.py`)."),
        "filename_tmpl": Opt(str, "08d", "Format of the frame number in keys and file names (`08d` REDS, `05d` "
                             "DVD and DAVIS, `06d` GoPro)."),
        "num_frame": Opt(int, REQUIRED, "Frames per training clip.", refuse=at_least(1)),
        "interval_list": Opt(list, [1], "Temporal strides; each item draws one at random.",
                             refuse=_refuse_intervals),
        "val_partition": Opt((str, list, type(None)), None, "Clips held out of training: `REDS4` (000, 011, 015, "
                             "020), `official` (240-269), a list of clip names, or null. Unlike KAIR, held out "
                             "whatever the dataset's `name`.", refuse=_refuse_partition),
        "test_mode": Opt(bool, False, "Keep only the `val_partition` clips instead of removing them."),
        "dataroot_flow": Opt(OPT_STR, None, "BasicSR's precomputed optical flow; only null.",
                             refuse=only(None, "VRT/RVRT estimate flow with SpyNet; remove dataroot_flow")),
    }
    reads_lq = True

    def __init__(self, opt: dict[str, Any]) -> None:
        super().__init__()
        self.opt = opt = resolve_options(type(self), opt)
        name = type(self).__name__
        self.scale = opt["scale"]
        self.gt_size = opt["gt_size"]
        self.filename_tmpl = opt["filename_tmpl"]
        ext = opt["filename_ext"]
        self.num_frame = opt["num_frame"]
        self.interval_list = list(opt["interval_list"])
        self.random_reverse = opt["random_reverse"]
        self.use_hflip, self.use_rot = opt["use_hflip"], opt["use_rot"]

        held_out = set(_partition(opt["val_partition"]))
        test_mode = opt["test_mode"]
        if test_mode and not held_out:
            raise ValueError(f"{name}: test_mode keeps only the val_partition clips, but val_partition is not set")
        ensure_meta_info(opt["meta_info_file"], opt["dataroot_gt"], "clips")
        clips = [c for c in read_meta_info(opt["meta_info_file"], 4) if (c[0] in held_out) == test_mode]
        if not clips:
            raise DataCheckError(f"{name}: no clip left in {opt['meta_info_file']} after val_partition")
        need = self.num_frame * max(self.interval_list)
        short = [f"{c} has {n} frames" for c, n, _ in clips if n < need]
        check_problems(short, f"{name}: clips shorter than num_frame x max(interval_list) = {need}")
        self.clips = [c for c, _, _ in clips]
        # per-item arrays (numpy: no per-item Python objects to copy-on-access in the workers)
        counts = np.array([n for _, n, _ in clips], dtype=np.int64)
        self._clip = np.repeat(np.arange(len(clips)), counts)
        self._nframes = np.repeat(counts, counts)
        self._start = np.repeat(np.array([s for _, _, s in clips], dtype=np.int64), counts)
        self._frame = np.concatenate([np.arange(s, s + n) for _, n, s in clips])

        self.gt_store = utils_video.make_store(opt["dataroot_gt"], opt["io_backend"], ext)
        self.lq_store = utils_video.make_store(opt["dataroot_lq"], opt["io_backend"], ext) if self.reads_lq else None
        if opt["check_data"]:
            self._check(opt["check_decode_samples"])
        logger.info("%s: %d clips, %d items (held out: %s), interval list %s, random reverse %s", name,
                    len(self.clips), len(self), sorted(held_out) or "none", self.interval_list, self.random_reverse)

    def _key(self, clip: int, frame: int) -> str:
        return f"{self.clips[clip]}/{frame:{self.filename_tmpl}}"

    def _check(self, samples: int) -> None:
        name = type(self).__name__
        keys = [self._key(c, f) for c, f in zip(self._clip.tolist(), self._frame.tolist())]
        firsts = [keys[i] for i in np.searchsorted(self._clip, np.arange(len(self.clips)))]
        entries = [(self.gt_store, self.scale, firsts)]
        if self.lq_store is not None:
            entries.insert(0, (self.lq_store, 1, firsts))
        _check_roots([store for store, _, _ in entries], name)
        for store, _, _ in entries:
            _check_keys(store, keys, name)
        _check_decodes(entries, samples, name)

    def __len__(self) -> int:
        return len(self._frame)

    def _neighbors(self, index: int) -> list[int]:
        interval = random.choice(self.interval_list)
        start, first, count = int(self._frame[index]), int(self._start[index]), int(self._nframes[index])
        endmost = first + count - self.num_frame * interval
        if start > endmost:
            start = random.randint(first, endmost)
        frames = list(range(start, start + self.num_frame * interval, interval))
        if self.random_reverse and random.random() < 0.5:
            frames = frames[::-1]
        return frames

    def __getitem__(self, index: int) -> dict[str, Any]:
        clip = int(self._clip[index])
        keys = [self._key(clip, f) for f in self._neighbors(index)]
        lqs, gts = [], []
        for key in keys:
            lqs.append(self.lq_store.get(key))
            gts.append(self.gt_store.get(key))
        gts, lqs = utils_video.paired_random_crop(gts, lqs, self.gt_size, self.scale, self.gt_store.locate(keys[-1]))
        out = utils_video.img2tensor(utils_video.augment(lqs + gts, self.use_hflip, self.use_rot))
        n = len(lqs)
        return {"L": torch.stack(out[:n]), "H": torch.stack(out[n:]), "key": self._key(clip, int(self._frame[index]))}


class VideoRecurrentTrainNonblindDenoisingDataset(VideoRecurrentTrainDataset):
    """GT clips (DAVIS) with Gaussian noise of one sigma per clip and the sigma map as a 4th input channel.

    Reads GT only (``dataroot_lq`` is ignored); same sampling, crop (scale 1) and flips as the parent. Then
    ``sigma ~ U[sigma_min, sigma_max] / 255`` (torch RNG), ``L = H + N(0, sigma)`` (not clipped).

    Args:
        opt: the keys of :attr:`OPTIONS`: the parent's plus ``sigma_min`` and ``sigma_max`` ([0, 255] scale).

    Item: ``{'L': (T, 4, gt_size, gt_size), 'H': (T, 3, gt_size, gt_size), 'key'}``; ``L[:, 3]`` is sigma.
    """

    OPTIONS: dict[str, Opt] = {
        **VideoRecurrentTrainDataset.OPTIONS,
        **NOISE_RANGE,
        "scale": Opt(int, 1, "Only 1: denoising restores at the input size.",
                     refuse=only(1, "denoising restores at the input size; set scale to 1")),
        "dataroot_lq": Opt(OPT_STR, None, "KAIR's files repeat the GT path here.",
                           note="the noisy input is synthesised from dataroot_gt"),
    }
    reads_lq = False

    def __init__(self, opt: dict[str, Any]) -> None:
        super().__init__(opt)
        self.sigma_min = self.opt["sigma_min"] / 255.0
        self.sigma_max = self.opt["sigma_max"] / 255.0
        if self.sigma_min > self.sigma_max:
            raise ValueError(f"{type(self).__name__}: need sigma_min <= sigma_max, got {self.opt['sigma_min']}, "
                             f"{self.opt['sigma_max']}")

    def __getitem__(self, index: int) -> dict[str, Any]:
        clip = int(self._clip[index])
        keys = [self._key(clip, f) for f in self._neighbors(index)]
        gts = [self.gt_store.get(key) for key in keys]
        gts, _ = utils_video.paired_random_crop(gts, gts, self.gt_size, 1, self.gt_store.locate(keys[-1]))
        gt = torch.stack(utils_video.img2tensor(utils_video.augment(gts, self.use_hflip, self.use_rot)))
        noise_level = torch.empty((1, 1, 1, 1)).uniform_(self.sigma_min, self.sigma_max)
        noise = torch.normal(mean=0.0, std=noise_level.expand_as(gt))
        t, _, h, w = gt.shape
        lq = torch.cat([gt + noise, noise_level.expand(t, 1, h, w)], dim=1)
        return {"L": lq, "H": gt, "key": self._key(clip, int(self._frame[index]))}


def vimeo_neighbors(num_frame: int, temporal_scale: int = 1) -> list[int]:
    """Vimeo frame numbers (1..7) of a clip: centred ``num_frame`` frames (``-1``: all 7), every
    ``temporal_scale``-th. E.g. ``(7, 1) -> [1..7]``, ``(7, 2) -> [1, 3, 5, 7]``, ``(3, 1) -> [3, 4, 5]``."""
    if num_frame == -1:
        num_frame = 7
    if not 1 <= num_frame <= 7 or temporal_scale < 1:
        raise ValueError(f"Vimeo num_frame must be -1 or 1..7 and temporal_scale >= 1, got {num_frame}, "
                         f"{temporal_scale}")
    return [i + (9 - num_frame) // 2 for i in range(num_frame)][::temporal_scale]


class VideoRecurrentTrainVimeoDataset(Dataset):
    """Vimeo-90K septuplets for video SR (x4 BI/BD): LQ and GT for every frame of ``vimeo_neighbors``.

    Keys come from ``meta_info_file`` (first field, ``00001/0001``); frames are ``<key>/im{n}`` (LMDB) or
    ``<root>/<key>/im{n}.png`` (disk). After crop and flips: ``mirror_sequence`` appends the reversed clip
    (7 -> 14 frames), else ``pad_sequence`` repeats the last frame (7 -> 8).

    Args:
        opt: the keys of :attr:`OPTIONS` (plus the common dataset keys); not modified.

    Item: ``{'L': (T, 3, h, w), 'H': (T, 3, H, W), 'key': 'clip/seq'}``, T = 7, 8 or 14 for num_frame 7.
    """

    OPTIONS: dict[str, Opt] = {
        **_CLIP_OPTIONS,
        **VIMEO_FRAME_OPTIONS,
        "dataroot_gt": Opt(str, REQUIRED, "GT septuplets holding every frame used (`<clip>/<seq>/im{n}`: "
                           "`vimeo90k_train_GT_all.lmdb`; KAIR's create_lmdb.py writes only im4)."),
        "dataroot_lq": Opt(str, REQUIRED, "LQ septuplets (`vimeo90k_train_LR7frames.lmdb`, BD: "
                           "`vimeo90k_train_BDLR7frames.lmdb`)."),
        "meta_info_file": Opt(str, REQUIRED, "Sequence list, one `clip/seq nframes (h,w,c)` line each "
                              "(`data/meta_info/meta_info_Vimeo90K_train_GT.txt`)."),
        "interval_list": Opt(list, [1], "Only [1]: a septuplet's frames are consecutive (KAIR's files set it).",
                             refuse=only([1], "Vimeo septuplets have a fixed frame stride; only [1]")),
    }

    def __init__(self, opt: dict[str, Any]) -> None:
        super().__init__()
        self.opt = opt = resolve_options(type(self), opt)
        self.scale = opt["scale"]
        self.gt_size = opt["gt_size"]
        self.neighbor_list = vimeo_neighbors(opt["num_frame"], opt["temporal_scale"])
        self.random_reverse = opt["random_reverse"]
        self.use_hflip, self.use_rot = opt["use_hflip"], opt["use_rot"]
        self.mirror_sequence, self.pad_sequence = opt["mirror_sequence"], opt["pad_sequence"]
        ensure_meta_info(opt["meta_info_file"], opt["dataroot_gt"], "vimeo")
        self.keys = [c for c, _, _ in read_meta_info(opt["meta_info_file"], 3)]
        ext = opt["filename_ext"]
        self.gt_store = utils_video.make_store(opt["dataroot_gt"], opt["io_backend"], ext)
        self.lq_store = utils_video.make_store(opt["dataroot_lq"], opt["io_backend"], ext)
        if opt["check_data"]:
            self._check(opt["check_decode_samples"])
        logger.info("%s: %d sequences, frames %s, random reverse %s", type(self).__name__, len(self.keys),
                    self.neighbor_list, self.random_reverse)

    def _gt_frames(self) -> list[int]:
        return self.neighbor_list

    def _check(self, samples: int) -> None:
        name = type(self).__name__
        gt_frames = self._gt_frames()
        _check_roots([self.lq_store, self.gt_store], name)
        _check_keys(self.lq_store, [f"{k}/im{n}" for k in self.keys for n in self.neighbor_list], name)
        _check_keys(self.gt_store, [f"{k}/im{n}" for k in self.keys for n in gt_frames], name,
                    " (the GT must hold these frames, e.g. vimeo90k_train_GT_all.lmdb)")
        _check_decodes([(self.lq_store, 1, [f"{k}/im{self.neighbor_list[0]}" for k in self.keys]),
                        (self.gt_store, self.scale, [f"{k}/im{gt_frames[0]}" for k in self.keys])], samples, name)

    def __len__(self) -> int:
        return len(self.keys)

    def _frames(self) -> list[int]:
        if self.random_reverse and random.random() < 0.5:
            return self.neighbor_list[::-1]
        return list(self.neighbor_list)

    def __getitem__(self, index: int) -> dict[str, Any]:
        frames = self._frames()
        key = self.keys[index]
        lqs = [self.lq_store.get(f"{key}/im{n}") for n in frames]
        gts = [self.gt_store.get(f"{key}/im{n}") for n in frames]
        gts, lqs = utils_video.paired_random_crop(gts, lqs, self.gt_size, self.scale, self.gt_store.locate(key))
        out = utils_video.img2tensor(utils_video.augment(lqs + gts, self.use_hflip, self.use_rot))
        lq, gt = torch.stack(out[:len(lqs)]), torch.stack(out[len(lqs):])
        if self.mirror_sequence:
            lq, gt = torch.cat([lq, lq.flip(0)]), torch.cat([gt, gt.flip(0)])
        elif self.pad_sequence:
            lq, gt = torch.cat([lq, lq[-1:]]), torch.cat([gt, gt[-1:]])
        return {"L": lq, "H": gt, "key": key}


class VideoRecurrentTrainVimeoVFIDataset(VideoRecurrentTrainVimeoDataset):
    """Vimeo-90K frame interpolation: input frames im1, im3, im5, im7 (num_frame 7, temporal_scale 2), target im4.

    Crop at ``scale`` (1 in V09) with shared flips; optional ``color_jitter`` applies one
    ``ColorJitter(0.05, 0.05, 0.05, 0.05)`` draw to the inputs and the target together. ``dataroot_lq`` is
    usually the GT LMDB itself (it is opened once).

    Item: ``{'L': (4, 3, gt_size, gt_size), 'H': (1, 3, gt_size, gt_size), 'key'}``.
    """

    OPTIONS: dict[str, Opt] = {
        **VideoRecurrentTrainVimeoDataset.OPTIONS,
        "scale": Opt(int, 1, "Upscaling factor (default: the top-level `scale`; 1 for a dataset built directly): "
                     "interpolation proper is 1, with `dataroot_lq` = `dataroot_gt`.", refuse=at_least(1)),
        "dataroot_gt": Opt(str, REQUIRED, "Vimeo-90K septuplets (`vimeo90k_train_GT_all.lmdb`); the target is "
                           "`im4`."),
        "dataroot_lq": Opt(str, REQUIRED, "The input frames: usually the GT LMDB itself (opened once)."),
        "temporal_scale": Opt(int, 2, "Keep every n-th of the `num_frame` frames: 2 gives the inputs im1, im3, im5, "
                              "im7 around the target im4.", refuse=at_least(1)),
        "pad_sequence": Opt(bool, False, "Only false: the inputs are the 4 frames as they are.",
                            refuse=only(False, "frame interpolation takes its input frames as they are")),
        "mirror_sequence": Opt(bool, False, "Only false: the inputs are the 4 frames as they are.",
                               refuse=only(False, "frame interpolation takes its input frames as they are")),
        "color_jitter": Opt(bool, False, "Apply one `ColorJitter(0.05, 0.05, 0.05, 0.05)` draw to the inputs and "
                            "the target together."),
    }

    def __init__(self, opt: dict[str, Any]) -> None:
        super().__init__(opt)
        self.color_jitter = transforms.ColorJitter(0.05, 0.05, 0.05, 0.05) if self.opt["color_jitter"] else None

    def _gt_frames(self) -> list[int]:
        return [4]

    def __getitem__(self, index: int) -> dict[str, Any]:
        frames = self._frames()
        key = self.keys[index]
        lqs = [self.lq_store.get(f"{key}/im{n}") for n in frames]
        gts = [self.gt_store.get(f"{key}/im4")]
        gts, lqs = utils_video.paired_random_crop(gts, lqs, self.gt_size, self.scale, self.gt_store.locate(key))
        stack = torch.stack(utils_video.img2tensor(utils_video.augment(lqs + gts, self.use_hflip, self.use_rot)))
        if self.color_jitter is not None:
            stack = self.color_jitter(stack)
        return {"L": stack[:-1], "H": stack[-1:], "key": key}
