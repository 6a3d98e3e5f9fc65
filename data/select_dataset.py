"""DATASETS registry: ``define_Dataset(dataset_opt)`` builds the dataset named by ``dataset_type``.

Names are KAIR's ``dataset_type`` values, lower-cased (``VideoRecurrentTrainDataset`` ->
``videorecurrenttraindataset``); the VFI test sets keep KAIR's ``vfi_davis`` / ``vfi_ucf101`` / ``vfi_vid4``.
Each class declares the keys of its option section in ``OPTIONS``; :func:`option_specs` hands them to
``utils_option.parse(..., dataset_specs=...)`` so an option file is checked before anything is built.
"""

from __future__ import annotations

import os
from typing import Any

from torch.utils.data import Dataset

from data.dataset_options import own_keys
from data.dataset_synthetic import SyntheticVideoTestDataset, SyntheticVideoTrainDataset
from data.dataset_video_file import VideoFileTestDataset
from data.dataset_video_file_train import VideoFileTrainDataset
from data.dataset_video_test import (
    VFI_DAVIS,
    VFI_UCF101,
    SingleVideoRecurrentTestDataset,
    VFI_Vid4,
    VideoRecurrentTestDataset,
    VideoTestVimeo90KDataset,
)
from data.dataset_video_train import (
    VideoRecurrentTrainDataset,
    VideoRecurrentTrainNonblindDenoisingDataset,
    VideoRecurrentTrainVimeoDataset,
    VideoRecurrentTrainVimeoVFIDataset,
)
from utils.utils_option_schema import Opt
from utils.utils_video_clips import is_video_file, list_videos

# Vimeo-90K-T's clip list (KAIR's name; written on first use or by scripts/generate_meta_info.py)
VIMEO_META = os.path.join(os.path.dirname(os.path.abspath(__file__)), "meta_info", "meta_info_Vimeo90K_test_GT.txt")

DATASETS: dict[str, type[Dataset]] = {
    "videorecurrenttraindataset": VideoRecurrentTrainDataset,
    "videorecurrenttrainnonblinddenoisingdataset": VideoRecurrentTrainNonblindDenoisingDataset,
    "videorecurrenttrainvimeodataset": VideoRecurrentTrainVimeoDataset,
    "videorecurrenttrainvimeovfidataset": VideoRecurrentTrainVimeoVFIDataset,
    "videorecurrenttestdataset": VideoRecurrentTestDataset,
    "singlevideorecurrenttestdataset": SingleVideoRecurrentTestDataset,
    "videotestvimeo90kdataset": VideoTestVimeo90KDataset,
    "vfi_davis": VFI_DAVIS,
    "vfi_ucf101": VFI_UCF101,
    "vfi_vid4": VFI_Vid4,
    "videofiletestdataset": VideoFileTestDataset,
    "videofiletraindataset": VideoFileTrainDataset,
    "syntheticvideotraindataset": SyntheticVideoTrainDataset,
    "syntheticvideotestdataset": SyntheticVideoTestDataset,
}


def option_specs() -> dict[str, dict[str, Opt]]:
    """The option keys of every registered dataset type, for ``utils_option.parse(..., dataset_specs=...)``.

    Returns:
        ``{dataset_type (lower-case): cls.OPTIONS}``; the parser adds ``DATASET_COMMON`` to each.
    """
    return {name: cls.OPTIONS for name, cls in DATASETS.items()}


def define_Dataset(dataset_opt: dict[str, Any], run_dir: str | None = None) -> Dataset:
    """Instantiate ``DATASETS[dataset_opt['dataset_type'].lower()](dataset_opt)`` (the dict is not modified).

    The section is checked against every registered type first, as an option file is: a key of a KAIR sibling
    type is accepted without effect (one note), an unknown key names the type that reads it.

    Args:
        dataset_opt: the dataset section.
        run_dir: the run's folder (``experiments/<task>``) when training builds the set: each key of the class's
            ``RUN_FOLDERS`` (``{key: sub-folder}``, e.g. the video-file set's frame-index cache) that the section
            leaves unset points into it.

    Raises:
        KeyError: unknown ``dataset_type`` (the message lists the registered ones).
        utils.utils_option.OptionError: an option the dataset class does not take, or a wrong type or value.
    """
    name = str(dataset_opt.get("dataset_type")).lower()
    if name not in DATASETS:
        raise KeyError(f"dataset_type={dataset_opt.get('dataset_type')!r} is unknown; registered: {sorted(DATASETS)}")
    cls = DATASETS[name]
    opt = own_keys(cls, dataset_opt, option_specs())
    if run_dir is not None:
        opt.update({key: os.path.join(run_dir, folder) for key, folder in getattr(cls, "RUN_FOLDERS", {}).items()
                    if not opt.get(key)})
    return cls(opt)


def define_test_set(lq: str, gt: str | None, *, sigma: int, vfi: bool, vimeo_mirror: bool, pad_vimeo: bool,
                    vfi_frames: int | None = None) -> Dataset:
    """The test set ``main_test_vrt.py`` reads from ``--folder_lq``/``--folder_gt``: the official script's choice by
    path, plus video files.

    A video file or a folder of them: :class:`VideoFileTestDataset`. A path naming ``vimeo``: Vimeo-90K-T (the
    frame-interpolation protocol, the mirrored 14 frames, or the 7 frames padded to 8 when ``pad_vimeo``). For
    frame interpolation a path naming ``davis``, ``ucf101`` or ``vid4``: that VFI set, read from ``gt``. Otherwise
    paired clip folders (``gt`` given) or LQ clip folders alone.

    Args:
        lq, gt: the two folders (``gt`` may be ``None``).
        sigma: noise level synthesised on the input (0: none).
        vfi: the network interpolates frames.
        vimeo_mirror: Vimeo-90K-T mirrored to 14 frames (RVRT's and BasicVSR++'s official protocol).
        pad_vimeo: Vimeo-90K-T's 7 frames padded to 8 (VRT's).
        vfi_frames: input frames of a frame-interpolation network (for the error message).

    Raises:
        ValueError: video files for a frame-interpolation network.
    """
    if is_video_file(lq) or (os.path.isdir(lq) and list_videos(lq)):
        if vfi:
            frames = vfi_frames or "input"
            raise ValueError(f"--folder_lq {lq}: frame interpolation is tested on the frame folders of the "
                             "interpolation test sets (a path naming vimeo, davis, ucf101 or vid4, whose items give "
                             f"the network its {frames} frames and score the frame between them), not on video files")
        return VideoFileTestDataset({"dataroot_lq": lq, "dataroot_gt": gt, "sigma": sigma})
    if "vimeo" in lq.lower():
        vimeo = {"meta_info_file": VIMEO_META, "num_frame": 7, "cache_data": False, "dataroot_gt": gt}
        if vfi:
            return VideoTestVimeo90KDataset({**vimeo, "dataroot_lq": gt, "pad_sequence": False, "temporal_scale": 2})
        if vimeo_mirror:
            return VideoTestVimeo90KDataset({**vimeo, "dataroot_lq": lq, "mirror_sequence": True})
        return VideoTestVimeo90KDataset({**vimeo, "dataroot_lq": lq, "pad_sequence": pad_vimeo, "temporal_scale": 1})
    if vfi:
        for key, cls in (("davis", VFI_DAVIS), ("ucf101", VFI_UCF101), ("vid4", VFI_Vid4)):
            if key in lq.lower():
                return cls(data_root=gt)
    common = {"dataroot_gt": gt, "dataroot_lq": lq, "sigma": sigma, "num_frame": -1, "cache_data": False}
    if gt is not None:
        return VideoRecurrentTestDataset(common)
    return SingleVideoRecurrentTestDataset(common)
