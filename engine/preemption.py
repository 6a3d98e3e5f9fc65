"""Stop requests: SIGTERM, SIGUSR1 or Ctrl-C end the run at the next step boundary, with a checkpoint of the step
all ranks agree on."""

from __future__ import annotations

import os
import signal
from typing import Any

from utils import utils_dist
from utils.utils_launch import STOP_ENV

STOP_SIGNALS = ("SIGTERM", "SIGUSR1", "SIGINT")


class StopRequest:
    """Remembers a SIGTERM/SIGUSR1/SIGINT so the loop can checkpoint at the next step boundary and exit.

    A second SIGINT (Ctrl-C pressed twice in a terminal) interrupts at once, as Python does by default.
    """

    def __init__(self) -> None:
        self.signal_name: str | None = os.environ.get(STOP_ENV) or None
        self._previous: dict[int, Any] = {}

    def install(self) -> None:
        for name in STOP_SIGNALS:
            signum = getattr(signal, name, None)
            if signum is not None:
                self._previous[signum] = signal.signal(signum, self._handle)

    def _handle(self, signum: int, frame: Any) -> None:
        del frame
        if signum == signal.SIGINT and self.signal_name == "SIGINT":
            raise KeyboardInterrupt
        self.signal_name = signal.Signals(signum).name  # nothing else here: a handler may interrupt logging

    def uninstall(self) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()

    def agreed(self) -> bool:
        """True on every rank when any rank received a stop signal (one small all-reduce)."""
        return utils_dist.all_reduce_max_int(int(self.signal_name is not None)) > 0
