"""Fixtures shared by several test modules."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(scope='module')
def one_thread():
    """Many small kernels on a shared CPU: one intra-op thread avoids OpenMP oversubscription stalls."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
