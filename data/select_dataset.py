"""DATASETS registry: ``define_Dataset(dataset_opt)`` builds the dataset named by ``dataset_type``.

Names are KAIR's ``dataset_type`` values, lower-cased (``VideoRecurrentTrainDataset`` ->
``videorecurrenttraindataset``); the VFI test sets keep KAIR's ``vfi_davis`` / ``vfi_ucf101`` / ``vfi_vid4``.
"""

from __future__ import annotations

from typing import Any

from torch.utils.data import Dataset

from data.dataset_synthetic import SyntheticVideoTestDataset, SyntheticVideoTrainDataset
from data.dataset_video_file import VideoFileTestDataset
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
    "syntheticvideotraindataset": SyntheticVideoTrainDataset,
    "syntheticvideotestdataset": SyntheticVideoTestDataset,
}


def define_Dataset(dataset_opt: dict[str, Any]) -> Dataset:
    """Instantiate ``DATASETS[dataset_opt['dataset_type'].lower()](dataset_opt)`` (the dict is not modified).

    Raises:
        KeyError: unknown ``dataset_type`` (the message lists the registered ones).
    """
    name = str(dataset_opt.get("dataset_type", "")).lower()
    if name not in DATASETS:
        raise KeyError(f"dataset_type={dataset_opt.get('dataset_type')!r} is unknown; registered: {sorted(DATASETS)}")
    return DATASETS[name](dataset_opt)
