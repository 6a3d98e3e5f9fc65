"""``python -m utils.utils_launch [torchrun args] main_train_vrt.py ...``: torchrun that stops cleanly on a signal.

torchrun forwards SIGTERM/SIGINT to its workers, gives them ``--shutdown-timeout`` seconds (30 by default) and
then exits with an error whatever they did, and SIGUSR1 (SLURM's ``--signal``) kills the agent outright. A
preempted job should instead end with a checkpoint and exit 0, so this wrapper runs torchrun's own ``main`` in
this process and takes over SIGTERM, SIGINT, SIGUSR1 and SIGHUP (a terminal's hang-up; left ignored under
``nohup``):

* the first one is forwarded to every worker; each stops at the next step boundary (the ranks agree on the step),
  rank 0 saves that step, the workers exit 0 and so does torchrun. Workers that torchrun starts afterwards (a
  restart racing the signal) see ``VRT_STOP_REQUESTED`` and stop before their first step;
* a second one ends the workers at once (SIGKILL; the newest complete checkpoint stays as it is).

Everything else (rendezvous, ``--max-restarts``, multi-node) is torchrun's, with one setting changed: under a c10d
rendezvous that several agents join (``--rdzv-backend=c10d`` without ``--standalone``) the agents do not lend their
rendezvous store to the workers (``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``, unless set). With the shared store, an
agent that was group rank 0 before keeps its old bootstrap address and does not publish one for the new round, so an
agent that joins later waits for it until the store times out (seen with torch 2.14:
``DynamicRendezvousHandler.next_rendezvous`` builds the address only on an agent's first round or when it becomes
rank 0); without it, rank 0 publishes a fresh address every round.

On the CPU, when the workers would run more OpenMP threads than the machine has cores (processes x
``OMP_NUM_THREADS`` > cores), the workers get ``OMP_WAIT_POLICY=PASSIVE`` (unless set): OpenMP threads that spin
while they wait starve the other processes' threads, and gloo's collectives then wait on them (a tiny VRT on 2 cores,
2 processes x 2 threads: 0.2-0.6 s per step passive, 3.7-60 s spinning; benchmarks/RESULTS.md).
"""

from __future__ import annotations

import logging
import os
import signal
import sys
from types import FrameType

import torch
from torch.distributed.elastic.multiprocessing.api import SignalException
from torch.distributed.run import get_args_parser
from torch.distributed.run import main as torchrun_main

from utils.utils_signals import STOP_SIGNALS, install_stop_handler

logger = logging.getLogger(__name__)

FORWARDED = STOP_SIGNALS  # SIGTERM, SIGUSR1, SIGINT, SIGHUP
STOP_ENV = "VRT_STOP_REQUESTED"  # read by the training loop (engine) of workers started after a stop request
SHARED_STORE_ENV = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"
WAIT_POLICY_ENV = "OMP_WAIT_POLICY"


def joinable_rendezvous(argv: list[str]) -> bool:
    """torchrun's arguments (flags or ``PET_*`` variables) ask for a c10d rendezvous that agents on several nodes
    join, leave and rejoin (not ``--standalone``)."""
    args = get_args_parser().parse_args(argv)
    return args.rdzv_backend == "c10d" and not args.standalone


def _children(pid: int) -> list[int]:
    """Direct children of ``pid`` (Linux ``/proc``): torchrun's workers, which run in sessions of their own."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        if ppid == pid:
            out.append(int(entry))
    return out


class _Forwarder:
    """Signal handler of the agent process: first signal forwarded to the workers, second one ends them."""

    def __init__(self) -> None:
        self.received: str | None = None

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        del frame
        name = signal.Signals(signum).name
        if self.received is not None:
            raise SignalException(f"second stop signal ({name}): ending the workers now", sigval=signal.SIGKILL)
        self.received = name
        os.environ[STOP_ENV] = name
        for pid in _children(os.getpid()):
            try:
                os.kill(pid, signum)
            except ProcessLookupError:
                pass


def cpu_threads_oversubscribed(argv: list[str], env: dict[str, str], cpus: int, cuda: bool) -> tuple[int, int] | None:
    """``(processes, threads per process)`` when CPU workers of this launch would run more threads than ``cpus``.

    Args:
        argv: torchrun's arguments (``--nproc_per_node`` as a number; ``auto``/``gpu`` are not judged).
        env: the environment the workers inherit (``OMP_NUM_THREADS``; torchrun sets 1 when it is unset and there
            are several processes).
        cpus: the cores this process may run on.
        cuda: whether the workers train on a GPU (then their CPU threads mostly wait on it: not judged).
    """
    if cuda:
        return None
    nproc = next((a.split("=", 1)[1] for a in argv if a.startswith("--nproc_per_node=") or
                  a.startswith("--nproc-per-node=")), None)
    if nproc is None:
        flags = [i for i, a in enumerate(argv) if a in ("--nproc_per_node", "--nproc-per-node")]
        nproc = argv[flags[0] + 1] if flags and flags[0] + 1 < len(argv) else "1"
    if not nproc.isdigit():
        return None
    processes = int(nproc)
    threads = env.get("OMP_NUM_THREADS", "")
    per_process = int(threads) if threads.isdigit() else (1 if processes > 1 else cpus)
    return (processes, per_process) if processes * per_process > cpus else None


def passive_wait_when_oversubscribed(argv: list[str]) -> None:
    """Set ``OMP_WAIT_POLICY=PASSIVE`` for the workers (unless set) when CPU workers would run more threads than
    this machine has cores (see the module docstring), with one log line."""
    if WAIT_POLICY_ENV in os.environ:
        return
    cpus = len(os.sched_getaffinity(0))
    cuda = os.environ.get("VRT_DEVICE") != "cpu" and torch.cuda.is_available()
    found = cpu_threads_oversubscribed(argv, dict(os.environ), cpus, cuda)
    if found is not None:
        os.environ[WAIT_POLICY_ENV] = "PASSIVE"
        logger.warning("%d processes x %d threads on %d cores: the workers get OMP_WAIT_POLICY=PASSIVE so that "
                       "waiting threads do not starve the other processes", *found, cpus)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # torchrun (re-)installs its handlers at every worker start; keep it away from the signals we take over
    if "--signals-to-handle" in get_args_parser()._option_string_actions:
        argv.insert(0, "--signals-to-handle=SIGQUIT")
    else:  # torch < 2.5 reads the environment only
        os.environ["TORCHELASTIC_SIGNALS_TO_HANDLE"] = "SIGQUIT"
    if SHARED_STORE_ENV not in os.environ and joinable_rendezvous(argv):
        os.environ[SHARED_STORE_ENV] = "1"  # see the module docstring
    passive_wait_when_oversubscribed(argv)
    forwarder = _Forwarder()
    install_stop_handler(forwarder)
    try:
        torchrun_main(argv)
    except SignalException as exc:
        logger.error("%s", exc)
        return 128 + signal.SIGKILL
    return 0


if __name__ == "__main__":
    sys.exit(main())
