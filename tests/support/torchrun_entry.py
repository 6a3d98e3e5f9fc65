"""``python -m torch.distributed.run`` with its Python stacks dumpable by SIGUSR2 (for diagnosing a hung test)."""

from __future__ import annotations

import faulthandler
import signal

from torch.distributed.run import main

if __name__ == "__main__":
    faulthandler.register(signal.SIGUSR2, all_threads=True)
    main()
