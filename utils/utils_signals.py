"""The signals that ask a run to stop, in one place for the training loop, the launcher and evaluation, and what
helper processes do with them.

SLURM (``scancel``, preemption with ``--signal``), ``timeout``, systemd and a terminal's hang-up or Ctrl-C signal
every process of a job at once, not only the main one. The main process turns the signal into a clean stop (a
checkpoint, or complete evaluation segments); its helper processes (DataLoader workers, which decode videos and
degrade clips) ignore it, so that none of them dies first and the main process's loader does not fail on a worker
"killed by signal" in the middle of the stop. A helper never outlives its main process: PyTorch's workers leave when
their parent is gone, and the loader ends them when it is shut down.
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from typing import Any

STOP_SIGNALS = ("SIGTERM", "SIGUSR1", "SIGINT", "SIGHUP")


def stop_signals() -> list[signal.Signals]:
    """The stop signals this platform has."""
    return [getattr(signal, name) for name in STOP_SIGNALS if hasattr(signal, name)]


def install_stop_handler(handler: Callable[[int, Any], None]) -> dict[int, Any]:
    """Install ``handler`` for every stop signal except those this process was started ignoring (``nohup`` ignores
    SIGHUP: it stays ignored). Returns the previous handlers, for :func:`restore_handlers`."""
    previous = {}
    for signum in stop_signals():
        if signal.getsignal(signum) is signal.SIG_IGN:
            continue
        previous[int(signum)] = signal.signal(signum, handler)
    return previous


def restore_handlers(previous: dict[int, Any]) -> None:
    for signum, handler in previous.items():
        signal.signal(signum, handler)


def ignore_stop_signals(worker_id: int | None = None) -> None:
    """In a helper process (usable as a DataLoader ``worker_init_fn``): leave the stop to the main process."""
    del worker_id
    for signum in stop_signals():
        signal.signal(signum, signal.SIG_IGN)
