"""Stop requests: SIGTERM, SIGUSR1, Ctrl-C or a hang-up end the run at the next step boundary, with a checkpoint of
the step all ranks agree on, also when the signal reaches every process of the job at once (the loader workers
ignore it: :mod:`utils.utils_signals`)."""

from __future__ import annotations

import os
import signal
from typing import Any

from utils import utils_dist
from utils.utils_launch import STOP_ENV
from utils.utils_signals import install_stop_handler, restore_handlers


class StopRequest:
    """Remembers a stop signal (:data:`utils.utils_signals.STOP_SIGNALS`: SIGTERM, SIGUSR1, Ctrl-C, a terminal's
    hang-up) so the loop can checkpoint at the next step boundary and exit.

    A second SIGINT (Ctrl-C pressed twice in a terminal) interrupts at once, as Python does by default.
    """

    def __init__(self) -> None:
        self.signal_name: str | None = os.environ.get(STOP_ENV) or None
        self._previous: dict[int, Any] = {}

    def install(self) -> None:
        self._previous = install_stop_handler(self._handle)

    def _handle(self, signum: int, frame: Any) -> None:
        del frame
        if signum == signal.SIGINT and self.signal_name == "SIGINT":
            raise KeyboardInterrupt
        self.signal_name = signal.Signals(signum).name  # nothing else here: a handler may interrupt logging

    def uninstall(self) -> None:
        restore_handlers(self._previous)
        self._previous = {}

    def agreed(self) -> bool:
        """True on every rank when any rank received a stop signal (one small all-reduce)."""
        return utils_dist.all_reduce_max_int(int(self.signal_name is not None)) > 0
