"""An optimized BLAS under MLX's CPU build (Linux).

The mlx-cpu wheel computes float32 matmuls with a reference BLAS; Debian's OpenBLAS is
~15x faster here (20 matmuls of 1024x1024: 11.3 s vs 0.7 s). Loading it with RTLD_GLOBAL
before `mlx.core` is imported makes MLX's BLAS calls bind to it, with no LD_PRELOAD and
no re-exec. MLX's quantized matmuls do not call BLAS, so the win needs a float32 model
(serving/model/loading.py asks every rank, and converts the bundled model when all have it).
On macOS MLX runs on Metal and uses Accelerate: nothing to do.
"""

from __future__ import annotations

import ctypes
import os
import sys

from contract.blas import find_openblas
from contract.rank_env import BLAS
from serving.machine import ranks_on_machine

_loaded: str | None = None  # what load_openblas loaded in this process


def load_openblas() -> str | None:
    """Load OpenBLAS for MLX before MLX is imported; returns its path, or None (macOS, not
    found, turned off with ORCHESTRATOR_BLAS=reference, or MLX already imported)."""
    path = find_openblas()
    if path is None or os.environ.get(BLAS) == "reference" or "mlx.core" in sys.modules:
        return None
    global _loaded
    os.environ.setdefault("OPENBLAS_NUM_THREADS", str(_threads_per_rank()))
    ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
    _loaded = path
    return path


def loaded_openblas() -> str | None:
    return _loaded


def _threads_per_rank() -> int:
    """This machine's cores shared by the ranks on it (a local test cluster runs several):
    the CPUs this process may run on (a container's cpuset, taskset), not the host's."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, (cores or 1) // ranks_on_machine())
