"""``python -m torch.distributed.run`` with its Python stacks dumpable by SIGUSR2 (for diagnosing a hung test), and
the OpenMP wait policy that ``launch_train.sh``'s launcher gives oversubscribed CPU workers."""

from __future__ import annotations

import faulthandler
import signal
import sys

from torch.distributed.run import main

from utils.utils_launch import passive_wait_when_oversubscribed

if __name__ == "__main__":
    faulthandler.register(signal.SIGUSR2, all_threads=True)
    passive_wait_when_oversubscribed(sys.argv[1:])
    main()
