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

UNKNOWN_SIGNAL = 255  # above every signal number: a stop whose name is not a signal's (from the environment)


class StopRequest:
    """Remembers a stop signal (:data:`utils.utils_signals.STOP_SIGNALS`: SIGTERM, SIGUSR1, Ctrl-C, a terminal's
    hang-up) so the loop can checkpoint at the next step boundary and exit.

    A second SIGINT (Ctrl-C pressed twice in a terminal) interrupts at once, as Python does by default.
    """

    def __init__(self) -> None:
        self.signal_name: str | None = os.environ.get(STOP_ENV) or None
        self.stopped_by: str | None = None  # the signal any rank received, once :meth:`agreed` saw it
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
        """True on every rank when any rank received a stop signal (one small all-reduce of the signal's number), and
        :attr:`stopped_by` names it on every rank: a signal forwarded to each task (SLURM's ``--signal=B:USR1``) may
        reach rank 0 after the others have stopped."""
        number = 0
        if self.signal_name is not None:
            known = getattr(signal.Signals, self.signal_name, None)
            number = int(known) if known is not None else UNKNOWN_SIGNAL
        agreed = utils_dist.all_reduce_max_int(number)
        if agreed:
            own = number == agreed and self.signal_name
            self.stopped_by = own or (signal.Signals(agreed).name if agreed != UNKNOWN_SIGNAL else "a stop signal")
        return agreed > 0
