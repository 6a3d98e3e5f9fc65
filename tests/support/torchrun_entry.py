"""``python -m torch.distributed.run`` with its Python stacks dumpable by SIGUSR2 (for diagnosing a hung test), and
the OpenMP wait policy that ``launch_train.sh``'s launcher gives oversubscribed CPU workers."""

from __future__ import annotations

import faulthandler
import os
import signal
import sys

from torch.distributed.run import main

from utils.utils_launch import WAIT_POLICY_ENV, cpu_threads_oversubscribed

if __name__ == "__main__":
    faulthandler.register(signal.SIGUSR2, all_threads=True)
    if WAIT_POLICY_ENV not in os.environ and cpu_threads_oversubscribed(
            sys.argv[1:], dict(os.environ), len(os.sched_getaffinity(0)), cuda=False):
        os.environ[WAIT_POLICY_ENV] = "PASSIVE"
    main()
