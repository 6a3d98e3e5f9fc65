"""How waiting OpenMP threads behave in a CPU run, chosen by the entry scripts before torch loads its OpenMP runtime
(the runtime reads these settings once, when it starts; nothing here imports torch).

OpenMP's threads spin while they wait for each other at the end of every parallel loop (libgomp's default is
300,000 spins before sleeping). On a machine another job is using, a spinning thread burns the core the thread it
waits for needs, and every small operator pays that: the demo's training step went from 0.62 s alone to 15 s next
to one busy process and 4.7 s next to another PyTorch job (2 cores, benchmarks/RESULTS.md). Training sets a short
spin (``GOMP_SPINCOUNT``, with Intel OpenMP's ``KMP_BLOCKTIME`` to match): 0.69 s alone, 1.7 s beside either;
evaluation, whose operators are large, sets ``OMP_WAIT_POLICY=PASSIVE`` (no spin): no cost alone, 5.1-5.3 s instead
of 7.7-8.4 s per clip beside another job. The intra-op thread count stays torch's (the physical cores), since the
numbers of a run depend on it. A user's own ``OMP_WAIT_POLICY``, ``GOMP_SPINCOUNT`` or ``KMP_BLOCKTIME`` is kept.
"""

from __future__ import annotations

import os
import sys
from collections.abc import MutableMapping

USER_KEYS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME")
TRAIN_SETTINGS = {"GOMP_SPINCOUNT": "3000", "KMP_BLOCKTIME": "1"}
EVAL_SETTINGS = {"OMP_WAIT_POLICY": "PASSIVE"}


def choose_wait_policy(settings: dict[str, str], environ: MutableMapping[str, str] | None = None) -> str:
    """Set ``settings`` in the environment unless the user set any of :data:`USER_KEYS`, and say what holds.

    Args:
        settings: :data:`TRAIN_SETTINGS` or :data:`EVAL_SETTINGS`.
        environ: the environment (default ``os.environ``).

    Returns:
        One phrase for the log: the settings in force and where they come from.

    Raises:
        RuntimeError: torch is already imported, so its OpenMP runtime would not see the settings (an entry script
            must call this before its first torch import).
    """
    env = os.environ if environ is None else environ
    given = {k: env[k] for k in USER_KEYS if k in env}
    if given:
        return "OpenMP waits: " + ", ".join(f"{k}={v}" for k, v in given.items()) + " (yours)"
    if "torch" in sys.modules and environ is None:
        raise RuntimeError("choose_wait_policy() must run before torch is imported")
    env.update(settings)
    return "OpenMP waits: " + ", ".join(f"{k}={v}" for k, v in settings.items()) + " (set for a CPU shared with " \
        "other jobs; set OMP_WAIT_POLICY to choose)"
