"""Test / validation datasets: whole clips from frame folders (KAIR names and option keys).

Items: ``{'L': (T, C, h, w), 'H': (T', 3, H, W), 'folder': str, 'lq_path': list[str], 'gt_path': list[str]}``,
float32 RGB in [0, 1]; ``lq_path``/``gt_path`` are always lists of file paths (also with ``cache_data``). With
``sigma`` (non-blind denoising) ``L`` is the noisy GT plus the sigma map as channel 4; the noise comes from a
local generator seeded with ``noise_seed`` (default 0: the official script's ``torch.manual_seed(0)`` noise for
every clip), so it is the same on any rank and worker and the global RNG is never touched. Each class's
``OPTIONS`` lists the keys it takes; KAIR keys the test sets cannot honour (``io_backend`` other than disk,
``num_frame`` other than -1 for whole clips) are refused with the reason.

The clip-folder sets also hand out an item's frames lazily (:meth:`SingleVideoRecurrentTestDataset.lazy_item`):
``'L'``/``'H'`` are then frame sources (:class:`data.frame_sources.FolderFrames`, ``NoisyFrames``) with ``len()`` and
``frames(start)``, which read one frame at a time, and give the frames of ``__getitem__`` bit for bit.
"""

from __future__ import annotations

import glob
import logging
import os
from typing import Any

import torch
import torchvision.transforms.functional as TF
from torch.utils.data import Dataset

from data.dataset_options import RGB_CHANNELS, at_least, only, resolve_options
from data.dataset_video_train import VIMEO_FRAME_OPTIONS, read_meta_lines, vimeo_neighbors
from data.frame_sources import NOISE_OPTIONS, FolderFrames, NoisyFrames, add_noise, sigma_map
from data.meta_info import ensure_meta_info
from utils.utils_option import OptionError
from utils.utils_option_schema import NUM, OPT_STR, REQUIRED, Opt
from utils.utils_video import DataCheckError, check_problems, list_frames, read_img_seq

logger = logging.getLogger(__name__)

__all__ = [
    "VFI_DAVIS",
    "VFI_UCF101",
    "VFI_Vid4",
    "SingleVideoRecurrentTestDataset",
    "VideoRecurrentTestDataset",
    "VideoTestVimeo90KDataset",
]


# options shared by the test sets (each default written once)
_CACHE = Opt(bool, False, "Decode every clip when the dataset is built and keep it in RAM (faster repeated "
             "validation; memory: the whole test set as float32).")
_DISK_ONLY = Opt(dict, {"type": "disk"}, 'Only `{"type": "disk"}`: test clips are read from frame folders (KAIR\'s '
                 "files set it; its test sets ignore it).", refuse=only({"type": "disk"}, "test clips are read from "
                                                                         "frame folders; only {\"type\": \"disk\"}"))
_WHOLE_CLIPS = Opt(int, -1, "Only -1: a test item is a whole clip (tile it in time with `val.num_frame_testing`).",
                   refuse=only(-1, "a test item is a whole clip; tile it in time with val.num_frame_testing"))
_META_NAMES = Opt(OPT_STR, None, "Clip list: the first field of each line names a clip folder (null: every "
                  "sub-folder, sorted).")
def _subfolders(root: str, opt: dict[str, Any]) -> list[str]:
    if not root or not os.path.isdir(root):
        raise DataCheckError(f"test data folder {root!r} does not exist")
    if opt["meta_info_file"]:
        return _meta_names(opt)
    return sorted(os.path.basename(p) for p in glob.glob(os.path.join(glob.escape(root), "*")) if os.path.isdir(p))


def _meta_names(opt: dict[str, Any], fmt: str = "clips") -> list[str]:
    path = opt["meta_info_file"]
    ensure_meta_info(path, opt.get("dataroot_gt"), fmt)
    names = [ln.split()[0] for ln in read_meta_lines(path) if ln]
    if not names:
        raise DataCheckError(f"meta_info_file {path} lists no clip")
    return names


def _first_decodes(clips: dict[str, list[str]], what: str) -> None:
    problems = []
    for paths in clips.values():
        try:
            read_img_seq(paths[:1])
        except DataCheckError as err:
            problems.append(str(err))
    check_problems(problems, what)


class SingleVideoRecurrentTestDataset(Dataset):
    """LQ-only clips: ``<dataroot_lq>/<clip>/<frames>`` (sorted image files), one item per clip.

    With a non-zero ``sigma`` the frames are taken as already noisy and the sigma map is appended (so the
    non-blind denoisers can run without GT, which KAIR cannot do).

    Args:
        opt: the keys of :attr:`OPTIONS` (plus the common dataset keys); not modified.

    Item: ``{'L': (T, C, h, w), 'folder': str, 'lq_path': list[str]}``.
    """

    OPTIONS: dict[str, Opt] = {
        "n_channels": RGB_CHANNELS,
        "dataroot_lq": Opt(str, REQUIRED, "Folder of clip folders, `<clip>/<frames>` (sorted image files)."),
        "dataroot_gt": Opt(OPT_STR, None, "Only null: this set reads LQ alone (VideoRecurrentTestDataset scores "
                           "against GT).", refuse=only(None, "this dataset reads LQ only; use "
                                                       "VideoRecurrentTestDataset to score against GT")),
        "meta_info_file": _META_NAMES,
        "cache_data": _CACHE,
        "sigma": Opt(NUM, 0, "Non-blind denoising of already noisy clips: their noise std ([0, 255] scale), "
                     "appended as the sigma map (channel 4); 0: none.", refuse=at_least(0)),
        "io_backend": _DISK_ONLY,
        "num_frame": _WHOLE_CLIPS,
    }

    def __init__(self, opt: dict[str, Any]) -> None:
        super().__init__()
        self.opt = opt = resolve_options(type(self), opt)
        self.cache_data = opt["cache_data"]
        self.sigma = opt["sigma"] / 255.0
        self.lq_root = opt["dataroot_lq"]
        self.lq_paths = self._frames(self.lq_root)
        self.folders = list(self.lq_paths)
        self.cache: dict[str, torch.Tensor] = {}
        if self.cache_data:
            self.cache = {f: read_img_seq(p) for f, p in self.lq_paths.items()}

    def _frames(self, root: str) -> dict[str, list[str]]:
        name = type(self).__name__
        clips = {c: list_frames(os.path.join(root, c)) if os.path.isdir(os.path.join(root, c)) else []
                 for c in _subfolders(root, self.opt)}
        check_problems([os.path.join(root, c) for c, p in clips.items() if not p],
                       f"{name}: clip folders missing or without images")
        if not clips:
            raise DataCheckError(f"{name}: no clip folder in {root}")
        _first_decodes(clips, f"{name}: unreadable frames")
        return clips

    def __len__(self) -> int:
        return len(self.folders)

    def _lq(self, folder: str) -> torch.Tensor:
        return self.cache[folder] if self.cache_data else read_img_seq(self.lq_paths[folder])

    def __getitem__(self, index: int) -> dict[str, Any]:
        folder = self.folders[index]
        lq = self._lq(folder)
        if self.sigma:
            lq = sigma_map(lq, self.sigma)
        return {"L": lq, "folder": folder, "lq_path": list(self.lq_paths[folder])}

    def lazy_item(self, index: int) -> dict[str, Any]:
        """The item with a :class:`FolderFrames` as ``'L'`` (nothing is decoded until its frames are read)."""
        folder = self.folders[index]
        lq = FolderFrames(self.lq_paths[folder], os.path.join(self.lq_root, folder), self.cache.get(folder),
                          self.sigma)
        return {"L": lq, "folder": folder, "lq_path": list(self.lq_paths[folder])}


class VideoRecurrentTestDataset(SingleVideoRecurrentTestDataset):
    """Paired clips ``<dataroot_lq>/<clip>/*`` and ``<dataroot_gt>/<clip>/*`` (REDS4, Vid4, DVD10, GoPro11, Set8...).

    LQ and GT clips are matched by name and must have the same frame count. With a non-zero ``sigma`` the LQ
    folder is not read and ``L`` is synthesised from GT (:func:`add_noise`, seed ``noise_seed``, plus the clip
    index when ``noise_seed_per_clip`` is true).

    Args:
        opt: the keys of :attr:`OPTIONS` (plus the common dataset keys); not modified.

    Item: ``{'L': (T, C, h, w), 'H': (T, 3, H, W), 'folder', 'lq_path', 'gt_path'}``.
    """

    OPTIONS: dict[str, Opt] = {
        **SingleVideoRecurrentTestDataset.OPTIONS,
        **NOISE_OPTIONS,
        "dataroot_gt": Opt(str, REQUIRED, "GT clip folders, matched to the LQ clips by name (same frame counts)."),
        "dataroot_lq": Opt(OPT_STR, None, "LQ clip folders `<clip>/<frames>`; required unless `sigma` > 0, which "
                           "synthesises the input from GT (then it is not read)."),
        "noise_seed_per_clip": Opt(bool, False, "Add the clip index to `noise_seed` (false: every clip gets the "
                                   "same noise draw, as in the official script)."),
    }

    def __init__(self, opt: dict[str, Any]) -> None:
        Dataset.__init__(self)
        self.opt = opt = resolve_options(type(self), opt)
        name = type(self).__name__
        self.cache_data = opt["cache_data"]
        self.sigma = opt["sigma"] / 255.0
        self.noise_seed = opt["noise_seed"]
        self.noise_seed_per_clip = opt["noise_seed_per_clip"]
        self.gt_root, self.lq_root = opt["dataroot_gt"], opt["dataroot_lq"]
        if not self.sigma and self.lq_root is None:
            raise OptionError(f"option '{name}.dataroot_lq' is required when sigma is 0 (no noise is synthesised)")
        if self.sigma and self.lq_root is not None:
            logger.info("%s: dataroot_lq is not read: with sigma %s the input is synthesised from GT", name,
                        opt["sigma"])
        self.gt_paths = self._frames(self.gt_root)
        self.folders = list(self.gt_paths)
        if self.sigma:
            self.lq_paths = self.gt_paths
        else:
            lq = self._frames(self.lq_root)
            problems = [f"{c}: not in {self.lq_root}" for c in self.folders if c not in lq]
            problems += [f"{c}: {len(lq[c])} LQ frames, {len(p)} GT frames" for c, p in self.gt_paths.items()
                         if c in lq and len(lq[c]) != len(p)]
            check_problems(problems, f"{name}: LQ/GT clips differ ({self.lq_root} vs {self.gt_root})")
            self.lq_paths = lq
        self.cache: dict[str, torch.Tensor] = {}
        self.gt_cache: dict[str, torch.Tensor] = {}
        if self.cache_data:
            self.gt_cache = {f: read_img_seq(self.gt_paths[f]) for f in self.folders}
            if not self.sigma:
                self.cache = {f: read_img_seq(self.lq_paths[f]) for f in self.folders}
        logger.info("%s: %d clips from %s", name, len(self.folders), self.gt_root)

    def __getitem__(self, index: int) -> dict[str, Any]:
        folder = self.folders[index]
        gt = self.gt_cache[folder] if self.cache_data else read_img_seq(self.gt_paths[folder])
        if self.sigma:
            seed = self.noise_seed + (index if self.noise_seed_per_clip else 0)
            lq = add_noise(gt, self.sigma, seed)
        else:
            lq = self._lq(folder)
        return {"L": lq, "H": gt, "folder": folder, "lq_path": list(self.lq_paths[folder]),
                "gt_path": list(self.gt_paths[folder])}

    def lazy_item(self, index: int) -> dict[str, Any]:
        """The item with frame sources as ``'L'`` and ``'H'``: :class:`FolderFrames`, or :class:`NoisyFrames` of
        the GT for a non-zero ``sigma``."""
        folder = self.folders[index]
        gt = FolderFrames(self.gt_paths[folder], os.path.join(self.gt_root, folder), self.gt_cache.get(folder))
        if self.sigma:
            lq: Any = NoisyFrames(gt, self.sigma, self.noise_seed + (index if self.noise_seed_per_clip else 0))
        else:
            lq = FolderFrames(self.lq_paths[folder], os.path.join(self.lq_root, folder), self.cache.get(folder))
        return {"L": lq, "H": gt, "folder": folder, "lq_path": list(self.lq_paths[folder]),
                "gt_path": list(self.gt_paths[folder])}


class VideoTestVimeo90KDataset(Dataset):
    """Vimeo-90K-T septuplets: LQ frames of ``vimeo_neighbors(num_frame, temporal_scale)``, GT ``im4``.

    ``pad_sequence`` repeats the last LQ frame; ``mirror_sequence`` appends the reversed clip.

    Args:
        opt: the keys of :attr:`OPTIONS` (plus the common dataset keys); not modified.

    Item: ``{'L': (T, 3, h, w), 'H': (1, 3, H, W), 'folder': 'clip/seq', 'idx': 'k/N', 'border': 0,
    'lq_path': list[str], 'gt_path': [str]}``.
    """

    OPTIONS: dict[str, Opt] = {
        "n_channels": RGB_CHANNELS,
        **VIMEO_FRAME_OPTIONS,
        "dataroot_gt": Opt(str, REQUIRED, "Vimeo-90K-T `sequences` folder; the GT is `<clip>/<seq>/im4.png`."),
        "dataroot_lq": Opt(str, REQUIRED, "LQ `sequences` folder (`im1.png`..`im7.png`); for interpolation the GT "
                           "folder itself."),
        "meta_info_file": Opt(str, REQUIRED, "Sequence list, first field `clip/seq` "
                              "(`data/meta_info/meta_info_Vimeo90K_test_GT.txt` or its fast/medium/slow splits)."),
        "cache_data": _CACHE,
        "io_backend": _DISK_ONLY,
    }

    def __init__(self, opt: dict[str, Any]) -> None:
        super().__init__()
        self.opt = opt = resolve_options(type(self), opt)
        frames = vimeo_neighbors(opt["num_frame"], opt["temporal_scale"])
        self.pad_sequence, self.mirror_sequence = opt["pad_sequence"], opt["mirror_sequence"]
        self.folders = _meta_names(opt, "vimeo")
        gt_root, lq_root = opt["dataroot_gt"], opt["dataroot_lq"]
        self.gt_paths = [os.path.join(gt_root, f, "im4.png") for f in self.folders]
        self.lq_paths = [[os.path.join(lq_root, f, f"im{n}.png") for n in frames] for f in self.folders]
        every = [p for ps in self.lq_paths for p in ps] + self.gt_paths
        check_problems([p for p in every if not os.path.isfile(p)], f"{type(self).__name__}: missing frames")
        _first_decodes({"lq": self.lq_paths[0][:1], "gt": self.gt_paths[:1]}, f"{type(self).__name__}: unreadable")
        self.cache: list[tuple[torch.Tensor, torch.Tensor]] = []
        if opt["cache_data"]:
            self.cache = [(read_img_seq(lq), read_img_seq([gt])) for lq, gt in zip(self.lq_paths, self.gt_paths)]

    def __len__(self) -> int:
        return len(self.folders)

    def __getitem__(self, index: int) -> dict[str, Any]:
        if self.cache:
            lq, gt = self.cache[index]
        else:
            lq, gt = read_img_seq(self.lq_paths[index]), read_img_seq([self.gt_paths[index]])
        if self.pad_sequence:
            lq = torch.cat([lq, lq[-1:]])
        if self.mirror_sequence:
            lq = torch.cat([lq, lq.flip(0)])
        return {"L": lq, "H": gt, "folder": self.folders[index], "idx": f"{index}/{len(self)}", "border": 0,
                "lq_path": list(self.lq_paths[index]), "gt_path": [self.gt_paths[index]]}


class _VFIBase(Dataset):
    """Quadruplet -> middle frame test sets, built from an option dict (``dataroot_gt``) or, as in KAIR, from a
    folder (``data_root=``). A subclass lists its items with :meth:`_build`: ``(folder, [in0, in1, in2, in3], gt)``.
    """

    OPTIONS: dict[str, Opt] = {"n_channels": RGB_CHANNELS}
    crop: tuple[int, int] | None = None

    def _root(self, opt: dict[str, Any] | str | None, data_root: str | None) -> str:
        """Resolve the options (a dict, or KAIR's ``data_root`` folder) and return the existing ``dataroot_gt``."""
        if not isinstance(opt, dict):
            root = opt or data_root
            opt = {} if root is None else {"dataroot_gt": root}
        self.opt = resolve_options(type(self), opt)
        root = self.opt["dataroot_gt"]
        if not os.path.isdir(root):
            raise DataCheckError(f"{type(self).__name__}: test data folder {root!r} does not exist")
        return root

    def _build(self, sets: list[tuple[str, list[str], str]]) -> None:
        self.sets = sets
        if not sets:
            raise DataCheckError(f"{type(self).__name__}: no frame quadruplet found")
        missing = [p for _, ins, gt in sets for p in [*ins, gt] if not os.path.isfile(p)]
        check_problems(missing, f"{type(self).__name__}: missing frames")
        _first_decodes({"first": sets[0][1][:1]}, f"{type(self).__name__}: unreadable")

    def __len__(self) -> int:
        return len(self.sets)

    def __getitem__(self, index: int) -> dict[str, Any]:
        folder, inputs, gt = self.sets[index]
        frames = read_img_seq([*inputs, gt])
        if self.crop is not None:
            frames = TF.center_crop(frames, list(self.crop))
        return {"L": frames[:4], "H": frames[4:], "folder": folder, "lq_path": list(inputs), "gt_path": [gt]}


def _clip_dirs(root: str) -> list[str]:
    return sorted(d for d in os.listdir(root) if os.path.isdir(os.path.join(root, d)) and not d.startswith("."))


class VFI_DAVIS(_VFIBase):
    """DAVIS VFI test: per clip, windows of 7 frames at stride 2; inputs s, s+2, s+4, s+6, target s+3;
    ``CenterCrop(480, 840)``. Built from an option dict (``dataroot_gt``) or ``data_root=``.

    Item: ``{'L': (4, 3, 480, 840), 'H': (1, 3, 480, 840), 'folder': str(index), 'lq_path', 'gt_path'}``.
    """

    OPTIONS: dict[str, Opt] = {
        **_VFIBase.OPTIONS,
        "dataroot_gt": Opt(str, REQUIRED, "DAVIS folder of clip folders of frames (inputs and targets alike)."),
    }
    crop = (480, 840)

    def __init__(self, opt: dict[str, Any] | str | None = None, data_root: str | None = None) -> None:
        super().__init__()
        root = self._root(opt, data_root)
        sets = []
        for clip in _clip_dirs(root):
            paths = list_frames(os.path.join(root, clip))
            for s in range(0, len(paths) - 6, 2):
                sets.append((str(len(sets)), paths[s:s + 7:2], paths[s + 3]))
        self._build(sets)


class VFI_UCF101(_VFIBase):
    """UCF101 VFI test: ``<root>/<item>/frame0..3.png`` -> ``framet.png``, ``CenterCrop(224)``.

    Item: ``{'L': (4, 3, 224, 224), 'H': (1, 3, 224, 224), 'folder': item name, 'lq_path', 'gt_path'}``.
    """

    OPTIONS: dict[str, Opt] = {
        **_VFIBase.OPTIONS,
        "dataroot_gt": Opt(str, REQUIRED, "UCF101 folder of items, each holding `frame0.png`..`frame3.png` (inputs) "
                           "and `framet.png` (target)."),
    }
    crop = (224, 224)

    def __init__(self, opt: dict[str, Any] | str | None = None, data_root: str | None = None) -> None:
        super().__init__()
        root = self._root(opt, data_root)
        sets = [(d, [os.path.join(root, d, f"frame{i}.png") for i in range(4)], os.path.join(root, d, "framet.png"))
                for d in _clip_dirs(root)]
        self._build(sets)


class VFI_Vid4(_VFIBase):
    """Vid4 VFI test: every odd frame of each clip is interpolated from frames -3, -1, +1, +3 (boundary frames
    repeated), as in the official script. No crop.

    Item: ``{'L': (4, 3, H, W), 'H': (1, 3, H, W), 'folder': clip, 'lq_path', 'gt_path'}``.
    """

    OPTIONS: dict[str, Opt] = {
        **_VFIBase.OPTIONS,
        "dataroot_gt": Opt(str, REQUIRED, "Vid4 folder of clip folders of frames (inputs and targets alike)."),
    }

    def __init__(self, opt: dict[str, Any] | str | None = None, data_root: str | None = None) -> None:
        super().__init__()
        root = self._root(opt, data_root)
        sets = []
        for clip in _clip_dirs(root):
            paths: list[str | None] = list(list_frames(os.path.join(root, clip)))
            if not paths:
                continue
            if len(paths) % 2 == 0:
                paths.append(paths[-1])
            paths = [paths[0], None, *paths, None, paths[-1]]
            for s in range(0, len(paths) - 6, 2):
                inputs = paths[s:s + 7:2]
                sets.append((clip, [str(p) for p in inputs], str(paths[s + 3])))
        self._build(sets)
