"""DATASETS registry: ``define_Dataset(dataset_opt)`` builds the dataset named by ``dataset_type``."""

from __future__ import annotations

from typing import Any

from torch.utils.data import Dataset

from data.dataset_synthetic import SyntheticVideoTestDataset, SyntheticVideoTrainDataset

DATASETS: dict[str, type[Dataset]] = {
    "syntheticvideotraindataset": SyntheticVideoTrainDataset,
    "syntheticvideotestdataset": SyntheticVideoTestDataset,
}


def define_Dataset(dataset_opt: dict[str, Any]) -> Dataset:
    """Instantiate ``DATASETS[dataset_opt['dataset_type'].lower()](dataset_opt)``.

    Raises:
        KeyError: unknown ``dataset_type`` (the message lists the registered ones).
    """
    name = str(dataset_opt.get("dataset_type", "")).lower()
    if name not in DATASETS:
        raise KeyError(f"dataset_type={dataset_opt.get('dataset_type')!r} is unknown; registered: {sorted(DATASETS)}")
    return DATASETS[name](dataset_opt)
