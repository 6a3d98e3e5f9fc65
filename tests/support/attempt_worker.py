"""One rank of a fake torchrun attempt: ``init_dist``, one all-reduce, then exit without tearing anything down
(as a crashed attempt does). Prints ``rank <R> sum <S>``. Used by ``test_utils_dist.py``."""

from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from utils import utils_dist  # noqa: E402

if __name__ == "__main__":
    time.sleep(float(os.environ.get("TEST_START_DELAY", "0")))
    info = utils_dist.init_dist("gloo", timeout_s=float(os.environ["TEST_TIMEOUT"]))
    value = torch.tensor([info.rank + 1.0])
    dist.all_reduce(value)
    print(f"rank {info.rank} sum {value.item():.0f}", flush=True)
    os._exit(0)  # no destroy_process_group: the attempt's keys stay in the agent's store
