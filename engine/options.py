"""Option files as the flows read them: the schema of ``utils.utils_option`` completed with every registered
dataset class and network constructor (which the bottom layer cannot import)."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from data.dataset_options import DATASET_FAMILIES
from data.select_dataset import option_specs
from models.select_network import network_specs
from utils import utils_option
from utils.utils_logger import FILE_ONLY

logger = logging.getLogger(__name__)


def parse_options(path: str | None, overrides: Iterable[str] = (), is_train: bool = True,
                  base: dict[str, Any] | None = None, notes: list[str] | None = None) -> dict[str, Any]:
    """:func:`utils.utils_option.parse` with the dataset and network schemas and the dataset families.

    Args:
        notes: collects the notes on keys accepted without effect (a sibling dataset type's key), for
            :func:`log_kair_notes` once logging is set up; ``None``: logged at once.

    Raises:
        utils.utils_option.OptionError: one line naming the file, key or value and what would be valid.
    """
    return utils_option.parse(path, overrides, is_train=is_train, base=base, dataset_specs=option_specs(),
                              net_specs=network_specs(), dataset_families=DATASET_FAMILIES.values(), notes=notes)


def log_kair_notes(path: str | None, notes: Iterable[str] = ()) -> None:
    """One line in ``train.log`` (not on the console) naming the KAIR keys the file sets that have no effect here,
    and why; then the ``notes`` collected by :func:`parse_options` (before any log handler existed), one line each."""
    if path:
        keys = utils_option.kair_notes(utils_option.load_json(path))
        if keys:
            logger.info("Accepted for compatibility, without effect here: %s", "; ".join(keys), extra=FILE_ONLY)
    for note in notes:
        logger.info("%s", note, extra=FILE_ONLY)
