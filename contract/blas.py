"""Where an optimized BLAS for MLX's CPU build lives on Linux: the agent reports it in the
fingerprint, the rank loads it (serving/blas.py). Standard library only."""

from __future__ import annotations

import sys
from pathlib import Path

# Debian/Ubuntu (libopenblas0-pthread) and Fedora/RHEL (openblas) locations.
OPENBLAS_CANDIDATES = (
    "/usr/lib/x86_64-linux-gnu/libopenblas.so.0",
    "/usr/lib/aarch64-linux-gnu/libopenblas.so.0",
    "/usr/lib64/libopenblas.so.0",
    "/usr/lib/libopenblas.so.0",
)
INSTALL_HINT = "apt install libopenblas0-pthread (Debian/Ubuntu) or dnf install openblas"


def find_openblas() -> str | None:
    """The OpenBLAS library on this Linux machine, or None (not found, or not Linux)."""
    if sys.platform != "linux":
        return None
    return next((path for path in OPENBLAS_CANDIDATES if Path(path).is_file()), None)


def describe_blas() -> str:
    """What MLX's matmuls run on here, for the fingerprint and `status`."""
    if sys.platform == "darwin":
        return "Metal (Accelerate on CPU)"
    path = find_openblas()
    return f"OpenBLAS {path}" if path else f"reference (slow; {INSTALL_HINT})"
