"""The one source of distributed truth: rank, local rank, world size, device and collectives.

Everything is read from the environment that the launcher sets:

* torchrun / ``torch.distributed.run`` / ``torch.distributed.launch`` (also under TorchX and a Kubeflow job that
  runs torchrun, which gets its settings from ``PET_*`` variables): ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``,
  ``MASTER_ADDR``, ``MASTER_PORT``;
* one process per pod (a Kubeflow PyTorchJob running the script itself): ``RANK``, ``WORLD_SIZE``,
  ``MASTER_ADDR``, ``MASTER_PORT`` with ``LOCAL_RANK`` absent (0);
* SLURM ``srun`` (fallback when ``RANK`` is absent): ``SLURM_PROCID``, ``SLURM_LOCALID``, ``SLURM_NTASKS``,
  and ``SLURM_NODELIST``/``SLURM_JOB_NODELIST`` for the master address;
* the legacy ``--local_rank``/``--local-rank`` argument only fills ``LOCAL_RANK`` when the environment lacks it.

Nothing here writes ``CUDA_VISIBLE_DEVICES``; the device of a process is ``cuda:LOCAL_RANK`` among the GPUs it
can see (the one GPU of an ``srun`` task bound to one), or the CPU.
"""

from __future__ import annotations

import datetime
import functools
import logging
import os
import re
import socket
import time
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple, TypeVar

import torch
import torch.distributed as dist

logger = logging.getLogger(__name__)

T = TypeVar("T")

DEFAULT_TIMEOUT_S = 1800


class DistInfo(NamedTuple):
    """Where this process stands in the job.

    Attributes:
        rank: global rank in ``[0, world_size)``.
        local_rank: rank on this node; selects the GPU.
        world_size: number of processes in the job.
        device: ``cuda:LOCAL_RANK`` or ``cpu``.
    """

    rank: int
    local_rank: int
    world_size: int
    device: torch.device

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    @property
    def is_master(self) -> bool:
        return self.rank == 0


class DistError(RuntimeError):
    """A launch or environment problem, reported as one line."""


def _int_env(env: Mapping[str, str], key: str) -> int | None:
    value = env.get(key)
    if value is None or value == "":
        return None
    try:
        return int(value)
    except ValueError as exc:
        raise DistError(f"environment variable {key}={value!r} is not an integer") from exc


def first_slurm_host(nodelist: str) -> str:
    """Return the first host name of a SLURM node list such as ``gpu[01-04,07],cpu3``.

    Args:
        nodelist: the compressed host list SLURM puts in ``SLURM_NODELIST``.

    Returns:
        The first host, e.g. ``gpu01``.
    """
    first = re.split(r",(?![^\[]*\])", nodelist.strip())[0]
    match = re.match(r"^([^\[]*)\[([^\]]+)\](.*)$", first)
    if not match:
        return first
    prefix, ranges, suffix = match.groups()
    start = ranges.split(",")[0].split("-")[0]
    return f"{prefix}{start}{suffix}"


def world_info_from_env(env: Mapping[str, str] | None = None) -> tuple[int, int, int]:
    """Read ``(rank, local_rank, world_size)`` from torchrun's variables, else SLURM's, else a single process.

    Args:
        env: the environment to read (defaults to ``os.environ``); passed explicitly by tests.

    Returns:
        ``(rank, local_rank, world_size)``.
    """
    env = os.environ if env is None else env
    world_size = _int_env(env, "WORLD_SIZE")
    rank = _int_env(env, "RANK")
    local_rank = _int_env(env, "LOCAL_RANK")
    if rank is None and world_size is None and _int_env(env, "SLURM_NTASKS") is not None:
        rank = _int_env(env, "SLURM_PROCID") or 0
        local_rank = _int_env(env, "SLURM_LOCALID") or 0
        world_size = _int_env(env, "SLURM_NTASKS") or 1
    world_size = 1 if world_size is None else world_size
    rank = 0 if rank is None else rank
    local_rank = rank if local_rank is None and world_size == 1 else (local_rank or 0)
    if world_size < 1 or not 0 <= rank < world_size:
        raise DistError(f"invalid distributed environment: RANK={rank}, WORLD_SIZE={world_size} "
                        "(need 0 <= RANK < WORLD_SIZE)")
    return rank, local_rank, world_size


def apply_legacy_local_rank(local_rank: int | None, env: dict[str, str] | None = None) -> None:
    """Fill ``LOCAL_RANK`` from a legacy ``--local_rank`` argument when the environment lacks it."""
    env = os.environ if env is None else env
    if local_rank is not None and "LOCAL_RANK" not in env:
        env["LOCAL_RANK"] = str(local_rank)


def _fill_slurm_rendezvous(env: dict[str, str]) -> None:
    """Under plain ``srun``, export the variables ``init_process_group('env://')`` needs."""
    if "RANK" in env or "SLURM_NTASKS" not in env:
        return
    rank, local_rank, world_size = world_info_from_env(env)
    nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST") or "127.0.0.1"
    env.setdefault("MASTER_ADDR", first_slurm_host(nodelist))
    env.setdefault("MASTER_PORT", "29500")
    env.update(RANK=str(rank), LOCAL_RANK=str(local_rank), WORLD_SIZE=str(world_size))


def select_device(local_rank: int, device: str | None = None, env: Mapping[str, str] | None = None) -> torch.device:
    """Pick this process's GPU when CUDA is usable (unless ``device='cpu'``), else the CPU.

    The GPU is ``cuda:LOCAL_RANK`` among the visible ones: torchrun lets every process of a node see all of the
    node's GPUs. A task that ``srun`` bound to one GPU (``--gpus-per-task=1`` or ``--gpu-bind``, so that
    ``CUDA_VISIBLE_DEVICES`` holds one id) sees that GPU only and uses it, whatever its ``SLURM_LOCALID``.

    Args:
        local_rank: the rank on this node.
        device: ``'cpu'`` forces the CPU (``VRT_DEVICE``).
        env: the environment to read (defaults to ``os.environ``).

    Raises:
        DistError: ``LOCAL_RANK`` is beyond the visible GPUs (and the process is not a task bound to one GPU).
    """
    env = os.environ if env is None else env
    if device == "cpu" or not torch.cuda.is_available():
        return torch.device("cpu")
    count = torch.cuda.device_count()
    if local_rank < count:
        return torch.device("cuda", local_rank)
    if count == 1 and _srun_task(env):
        return torch.device("cuda", 0)
    visible = env.get("CUDA_VISIBLE_DEVICES", "<unset>")
    if _srun_task(env):
        hint = (f"bind one GPU to each task (srun --gpus-per-task=1, or --gpu-bind=single:1) or start at most {count} "
                "tasks per node")
    else:
        hint = f"start at most {count} processes per node (torchrun --nproc_per_node={count})"
    raise DistError(f"LOCAL_RANK={local_rank} but only {count} GPU(s) are visible (CUDA_VISIBLE_DEVICES={visible}); "
                    f"{hint}")


def _srun_task(env: Mapping[str, str]) -> bool:
    """A task started by ``srun`` itself (torchrun's workers carry ``LOCAL_WORLD_SIZE``)."""
    return "SLURM_LOCALID" in env and "LOCAL_WORLD_SIZE" not in env


def get_dist_info() -> DistInfo:
    """Return this process's :class:`DistInfo`; valid before and after :func:`init_dist`."""
    rank, local_rank, world_size = world_info_from_env()
    return DistInfo(rank, local_rank, world_size, select_device(local_rank, os.environ.get("VRT_DEVICE")))


def init_dist(backend: str | None = None, timeout_s: float | None = None) -> DistInfo:
    """Initialise the process group from the environment (a no-op for one process).

    Args:
        backend: ``nccl``/``gloo``; default ``nccl`` with CUDA, else ``gloo``. The ``VRT_DIST_BACKEND``
            environment variable overrides the default.
        timeout_s: collective timeout in seconds (default 1800, or ``VRT_DIST_TIMEOUT``).

    Returns:
        The :class:`DistInfo` of this process.
    """
    _fill_slurm_rendezvous(os.environ)  # type: ignore[arg-type]
    info = get_dist_info()
    if info.device.type == "cuda":
        torch.cuda.set_device(info.device)
    if not info.distributed or dist.is_initialized():
        return info
    backend = backend or os.environ.get("VRT_DIST_BACKEND") or ("nccl" if info.device.type == "cuda" else "gloo")
    if backend == "nccl" and info.device.type != "cuda":
        raise DistError("dist_backend 'nccl' needs CUDA; use 'gloo' on the CPU")
    timeout = float(timeout_s or os.environ.get("VRT_DIST_TIMEOUT") or DEFAULT_TIMEOUT_S)
    kwargs: dict[str, Any] = {"backend": backend, "timeout": datetime.timedelta(seconds=timeout)}
    if backend == "nccl":
        kwargs["device_id"] = info.device
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        kwargs.update(store=_attempt_store(info, timeout), rank=info.rank, world_size=info.world_size)
    dist.init_process_group(**kwargs)
    logger.debug("process group up: %s", info)
    return info


ATTEMPT_STORE_KEY = "vrt/attempt_store"
_PROBE_TIMEOUT_S = 5.0


def attempt_store_key(env: Mapping[str, str] | None = None) -> str:
    """The agent-store key under which rank 0 publishes its attempt's store; one per job (``TORCHELASTIC_RUN_ID``),
    as jobs may share one c10d rendezvous endpoint."""
    env = os.environ if env is None else env
    return f"{ATTEMPT_STORE_KEY}/{env.get('TORCHELASTIC_RUN_ID', '')}"


def own_address(peer: str, port: int) -> str:
    """This host's address on the route to ``peer``: where the other nodes reach a server that this process hosts.

    A UDP ``connect`` only picks the route and sends nothing. Falls back to the host name.
    """
    try:
        family, _, _, _, sockaddr = socket.getaddrinfo(peer, port, type=socket.SOCK_DGRAM)[0]
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.connect(sockaddr)
            return str(probe.getsockname()[0])
    except OSError:
        return socket.getfqdn()


def _attempt_store(info: DistInfo, timeout_s: float) -> dist.TCPStore:
    """A key-value store that belongs to this launch attempt alone.

    torchrun (since torch 2.5) lends its workers the agent's TCPStore and keeps it across ``--max-restarts``
    attempts and elastic membership changes, so the keys of a crashed attempt stay behind (pytorch/pytorch#135712).
    A restarted rank that starts before rank 0 reads rank 0's dead gloo/NCCL address and waits for the whole
    timeout. Here rank 0 hosts a new store sized for this attempt's world and publishes ``host:port:nonce`` in the
    agent's store; the other ranks take a published entry only once the store behind it answers with that nonce,
    which a previous attempt's (dead) store cannot do. The host is rank 0's own address: under the c10d rendezvous
    the agent's store (``MASTER_ADDR``) lives on the endpoint's node, and rank 0 may run on any node.
    """
    addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    key = attempt_store_key()
    full = datetime.timedelta(seconds=timeout_s)
    agent = dist.TCPStore(addr, port, is_master=False, timeout=full, wait_for_workers=False)
    if info.rank == 0:
        nonce = os.urandom(8).hex()
        store = dist.TCPStore(addr, 0, info.world_size, is_master=True, timeout=full, wait_for_workers=False)
        store.set("nonce", nonce)
        agent.set(key, f"{own_address(addr, port)}:{store.port}:{nonce}")
        return store
    probe = datetime.timedelta(seconds=_PROBE_TIMEOUT_S)
    deadline = time.monotonic() + timeout_s
    while True:
        host, store_port, nonce = agent.get(key).decode().rsplit(":", 2)
        try:
            socket.create_connection((host, int(store_port)), timeout=_PROBE_TIMEOUT_S).close()  # quiet first look
            store = dist.TCPStore(host, int(store_port), is_master=False, timeout=probe, wait_for_workers=False)
            if store.get("nonce").decode() == nonce:
                store.set_timeout(full)
                return store
        except (OSError, RuntimeError, ValueError):  # a previous attempt's entry: its store is gone (or is not ours)
            pass
        if time.monotonic() > deadline:
            raise DistError(f"rank {info.rank}: rank 0 did not publish this attempt's store at {addr}:{port} "
                            f"within {timeout_s:.0f} s")
        time.sleep(0.5)


def destroy_dist() -> None:
    """Tear the process group down if it is up (called from a ``finally``)."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def is_dist() -> bool:
    return dist.is_available() and dist.is_initialized()


def get_rank() -> int:
    return dist.get_rank() if is_dist() else world_info_from_env()[0]


def get_world_size() -> int:
    return dist.get_world_size() if is_dist() else 1


def master_only(func: Callable[..., T]) -> Callable[..., T | None]:
    """Run ``func`` on rank 0 only; other ranks get ``None``.

    Never wrap code that calls a collective: the other ranks would not enter it. Follow the call with
    :func:`barrier` where other ranks depend on its effect.
    """

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> T | None:
        if get_rank() == 0:
            return func(*args, **kwargs)
        return None

    return wrapper


def barrier() -> None:
    """Synchronise all ranks; a no-op without a process group."""
    if is_dist():
        dist.barrier()


def broadcast_object(obj: T, src: int = 0) -> T:
    """Return rank ``src``'s ``obj`` on every rank (pickled; for small control data only)."""
    if not is_dist():
        return obj
    holder = [obj]
    dist.broadcast_object_list(holder, src=src)
    return holder[0]


def all_gather_object(obj: T) -> list[T]:
    """Every rank's ``obj``, in rank order (pickled; for small control data only)."""
    if not is_dist():
        return [obj]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def _collective_device() -> torch.device:
    if is_dist() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def reduce_mean_dict(values: Mapping[str, float]) -> dict[str, float]:
    """Average a dict of scalars over ranks (every rank must pass the same keys); the key order is kept."""
    if not values:
        return {}
    if not is_dist():
        return {k: float(v) for k, v in values.items()}
    keys = sorted(values)  # the same order on every rank
    tensor = torch.tensor([float(values[k]) for k in keys], dtype=torch.float64, device=_collective_device())
    dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    tensor /= dist.get_world_size()
    reduced = dict(zip(keys, tensor.cpu().tolist()))
    return {k: reduced[k] for k in values}


def all_reduce_sum(tensor: torch.Tensor) -> torch.Tensor:
    """Sum a tensor over ranks (returns a new CPU float64 tensor)."""
    out = tensor.detach().to(device=_collective_device(), dtype=torch.float64).clone()
    if is_dist():
        dist.all_reduce(out, op=dist.ReduceOp.SUM)
    return out.cpu()


def all_reduce_max_int(value: int) -> int:
    """The maximum of an integer over ranks (used to agree on a step)."""
    if not is_dist():
        return int(value)
    tensor = torch.tensor([int(value)], dtype=torch.int64, device=_collective_device())
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return int(tensor.item())


def rank0_first(lead: Callable[[], T], follow: Callable[[], Any] | None = None, *,
                catch: tuple[type[BaseException], ...] = (Exception,),
                raise_as: Callable[[str, str], BaseException] | None = None) -> T | None:
    """Rank 0 runs ``lead`` (a fetch, a write, an index build), then the other ranks run ``follow`` (reading what it
    made); an error of ``lead`` reaches every rank, so all of them go on or all stop (under torchrun one rank
    failing alone would leave the others waiting in their next collective).

    Without a process group the process runs ``lead`` when it is rank 0 (every single process), else ``follow``.

    Args:
        lead: rank 0's work; its result is returned on rank 0.
        follow: the other ranks' work after ``lead`` succeeded (``None``: nothing); its result is returned there.
        catch: the exceptions of ``lead`` that are handed to the other ranks (others propagate on rank 0 alone).
        raise_as: builds the other ranks' exception from the type name and the text of rank 0's
            (default: ``RuntimeError('on rank 0: <type>: <text>')``).

    Raises:
        On rank 0, ``lead``'s exception itself; on the other ranks, ``raise_as(type name, text)`` of it.
    """
    if get_rank() == 0:
        try:
            result = lead()
        except catch as exc:
            broadcast_object((type(exc).__name__, str(exc)))
            raise
        broadcast_object(None)
        return result
    failure = broadcast_object(None)
    if failure is not None:
        name, text = failure
        raise (raise_as or _on_rank0)(name, text)
    return follow() if follow is not None else None


def _on_rank0(name: str, text: str) -> RuntimeError:
    return RuntimeError(f"on rank 0: {name}: {text}")
