"""MLX's memory limit on a rank, and telling its allocation failures apart.

With `[serving] memory_limit_gb` set, each rank caps MLX's allocations there
(`mx.set_memory_limit`) and, on a Mac, wires at most that much (`mx.set_wired_limit`,
never above the GPU's recommended working set, which MLX refuses): a batch that outgrows
it fails an allocation, an exception the rank exits on with OUT_OF_MEMORY and the
supervisor calls `oom`, rather than the machine swapping until it freezes.
"""

from __future__ import annotations

import logging
import re

import mlx.core as mx

log = logging.getLogger(__name__)

# MLX's allocation failures (mlx/backend/metal/allocator.cpp and the CPU allocator):
# "[malloc] Unable to allocate 1073741824 bytes.", "[metal::malloc] Resource limit
# (499000) exceeded.", "[metal::malloc] Attempting to allocate N bytes which is greater
# than the maximum allowed buffer size of M bytes."
ALLOCATION_FAILED = re.compile(r"\[(?:metal::)?malloc(?:_or_wait)?\]|Unable to allocate")


def is_out_of_memory(exc: BaseException) -> bool:
    return isinstance(exc, MemoryError) or bool(ALLOCATION_FAILED.search(str(exc)))


def apply_memory_limit(limit_gb: float | None) -> None:
    """Set MLX's limits from the configured budget; None keeps MLX's defaults."""
    if limit_gb is None:
        return
    limit = int(limit_gb * 1e9)
    mx.set_memory_limit(limit)
    wired = 0
    if mx.metal.is_available():
        recommended = int(mx.device_info().get("max_recommended_working_set_size", 0))
        wired = min(limit, recommended) if recommended else 0
        if wired:
            mx.set_wired_limit(wired)
    log.info("MLX memory limit %.2f GB%s", limit / 1e9,
             f", wired limit {wired / 1e9:.2f} GB" if wired else "")
