"""MLX's memory limit from [serving] memory_limit_gb, and its allocation failures told apart."""

from __future__ import annotations

import mlx.core as mx
import pytest

from contract.exit_codes import RankExit
from serving.memory_limit import apply_memory_limit, is_out_of_memory
from serving.rank.startup import exit_for


@pytest.mark.parametrize(
    "message",
    [
        "[malloc] Unable to allocate 1073741824 bytes.",
        "[metal::malloc] Resource limit (499000) exceeded.",
        "[metal::malloc] Attempting to allocate 17179869184 bytes which is greater than the "
        "maximum allowed buffer size of 9663676416 bytes.",
    ],
)
def test_mlx_allocation_failures_exit_out_of_memory(message: str) -> None:
    """MLX's allocator's errors (its source's exact words) make the rank exit OUT_OF_MEMORY."""
    assert is_out_of_memory(RuntimeError(message))
    assert exit_for(RuntimeError(message)) == RankExit.OUT_OF_MEMORY


def test_other_errors_stay_internal() -> None:
    """A bug is not an out-of-memory."""
    assert not is_out_of_memory(RuntimeError("[matmul] shapes (2,3) and (4,5) differ"))
    assert exit_for(RuntimeError("boom")) == RankExit.INTERNAL_ERROR


def test_memory_limit_is_set_on_mlx() -> None:
    """The configured budget becomes MLX's memory limit; None leaves MLX's default."""
    before = mx.get_memory_limit() if hasattr(mx, "get_memory_limit") else None
    previous = mx.set_memory_limit(0)
    try:
        apply_memory_limit(None)
        assert mx.set_memory_limit(0) == 0  # untouched
        apply_memory_limit(1.5)
        assert mx.set_memory_limit(0) == 1_500_000_000
    finally:
        mx.set_memory_limit(previous)
    assert before is None or mx.get_memory_limit() == before


@pytest.mark.skipif(
    not mx.metal.is_available(),
    reason="MLX's CPU build has no allocation error to catch: a failed malloc there is a "
    "SIGSEGV (checked with mlx 0.32.4 on Linux), so only Metal's is testable",
)
def test_metal_s_real_allocation_error_is_out_of_memory() -> None:
    """A buffer beyond Metal's largest fails in MLX's allocator; that very exception makes
    the rank exit OUT_OF_MEMORY (`oom`)."""
    too_big = int(mx.device_info()["max_buffer_length"]) + 4096
    with pytest.raises(RuntimeError) as raised:
        mx.eval(mx.zeros((too_big,), dtype=mx.uint8) + 1)
    assert is_out_of_memory(raised.value), str(raised.value)
    assert exit_for(raised.value) == RankExit.OUT_OF_MEMORY
