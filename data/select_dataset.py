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
