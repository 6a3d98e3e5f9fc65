"""The numerics policy of a run: deterministic kernels, TF32 and cuDNN autotuning, applied once per process.

Deterministic mode (``train.deterministic``) makes two runs of one command bit-identical on the same hardware
and software, and a resumed run bit-identical to an uninterrupted one:

* ``torch.use_deterministic_algorithms(True)``: PyTorch picks deterministic kernels where it has them (e.g.
  ``index_add``/``index_select`` backward, the memory-efficient attention backward without key splitting) and
  raises where it has none; the networks switch their sampling, resizing and padding ops to deterministic
  formulations on such devices (``models.layers_warp.deterministic_kernels``);
* cuDNN deterministic algorithms and no autotuning (``cudnn.benchmark`` picks the fastest algorithm per run,
  which may differ between runs);
* ``CUBLAS_WORKSPACE_CONFIG=:4096:8`` (cuBLAS reproducibility), which must be in the environment before cuBLAS
  starts: :func:`prepare_environment` is called by the entry script before any CUDA work.

On the CPU the kernels our networks use are deterministic at any thread count with or without this mode;
different thread counts sum in different orders, so a run is reproduced at the same thread count.

TF32 (``train.tf32``, default off): fp32 matmuls and convolutions in TF32 on Ampere and newer GPUs (10 mantissa
bits). Off keeps fp32 results comparable with the CPU and the reference's fp32 numbers; for speed, use
``train.amp: bf16``.
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping
from typing import Any, NamedTuple

import torch

CUBLAS_WORKSPACE = ":4096:8"
AMP_DTYPES: dict[str, torch.dtype | None] = {"none": None, "bf16": torch.bfloat16, "fp16": torch.float16}


class NumericsState(NamedTuple):
    """The process-wide settings :func:`apply_policy` changes (to restore them afterwards)."""

    deterministic: bool
    fill_uninitialized: bool
    cudnn_deterministic: bool
    cudnn_benchmark: bool
    matmul_tf32: bool
    cudnn_tf32: bool


def current_state() -> NumericsState:
    return NumericsState(torch.are_deterministic_algorithms_enabled(),
                         torch.utils.deterministic.fill_uninitialized_memory, torch.backends.cudnn.deterministic,
                         torch.backends.cudnn.benchmark, torch.backends.cuda.matmul.allow_tf32,
                         torch.backends.cudnn.allow_tf32)


def restore_state(state: NumericsState) -> None:
    torch.use_deterministic_algorithms(state.deterministic)
    torch.utils.deterministic.fill_uninitialized_memory = state.fill_uninitialized
    torch.backends.cudnn.deterministic = state.cudnn_deterministic
    torch.backends.cudnn.benchmark = state.cudnn_benchmark
    torch.backends.cuda.matmul.allow_tf32 = state.matmul_tf32
    torch.backends.cudnn.allow_tf32 = state.cudnn_tf32


def prepare_environment(deterministic: bool, env: MutableMapping[str, str] | None = None) -> None:
    """Put ``CUBLAS_WORKSPACE_CONFIG`` in the environment for deterministic runs (before cuBLAS starts); a value
    the user set is kept."""
    env = os.environ if env is None else env
    if deterministic:
        env.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE)


def apply_policy(deterministic: bool, tf32: bool, device: torch.device) -> dict[str, Any]:
    """Apply the policy to this process.

    Args:
        deterministic: deterministic kernels (see the module docstring).
        tf32: allow TF32 in fp32 matmuls and convolutions (CUDA).
        device: the training device (what is reported depends on it).

    Returns:
        A summary for the log: ``{'deterministic', 'tf32', 'cudnn_benchmark', 'cublas_workspace', 'caveats'}``,
        where ``caveats`` lists what keeps a run from being reproducible (empty when nothing does).
    """
    torch.use_deterministic_algorithms(deterministic)
    # Filling every torch.empty with NaN only exposes code that reads memory it never wrote, which ours does not;
    # it costs a full write of every new tensor (about 6% of a VRT train step on the CPU).
    torch.utils.deterministic.fill_uninitialized_memory = False
    torch.backends.cudnn.deterministic = deterministic
    torch.backends.cudnn.benchmark = not deterministic
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    caveats = []
    workspace = os.environ.get("CUBLAS_WORKSPACE_CONFIG")
    if device.type == "cuda":
        if not deterministic:
            caveats.append("train.deterministic is false: CUDA kernels (atomic adds in grid sampling, deformable "
                           "convolution, index backward, split-key attention backward, cuDNN autotuning) make "
                           "two runs, and a resumed run, differ in the last bits")
        elif workspace not in (":4096:8", ":16:8"):
            caveats.append(f"CUBLAS_WORKSPACE_CONFIG={workspace!r}: cuBLAS is not reproducible without :4096:8 "
                           "or :16:8 (set it before the process starts)")
    return {"deterministic": deterministic, "tf32": tf32, "cudnn_benchmark": not deterministic,
            "cublas_workspace": workspace, "caveats": caveats}


def cpu_has_native_bf16() -> bool:
    """Whether this CPU multiplies bfloat16 natively (AVX-512 BF16 or AMX, read from ``/proc/cpuinfo``).

    Without them PyTorch emulates bf16 matrix products and convolutions, 30-60x slower than fp32 (AVX2:
    benchmarks/RESULTS.md), so CPU runs of bf16 code paths are kept to the smallest shapes there.
    """
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags
