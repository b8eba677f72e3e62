"""A rank's KV budget at start-up and the MLX memory limit it sets from it."""

from __future__ import annotations

from pathlib import Path

import mlx.core as mx
import pytest

from contract.settings import ModelSettings, RankSettings, ServingSettings
from serving.faults import FaultPlan
from serving.rank.kv_setup import MIN_HEADROOM_BYTES
from serving.rank.startup import load_and_sync, make_batch


@pytest.mark.parametrize(
    ("serving", "placed", "budget"),
    [({"kv_cache_gb": 0.5}, [7], 500_000_000), ({}, [123_456_789], 123_456_789)],
)
def test_the_budget_sets_mlx_memory_limit(
    tiny_model_dir: Path, serving: dict[str, float], placed: list[int], budget: int
) -> None:
    """kv_cache_gb wins over the budget preflight placed; without memory_limit_gb, MLX's
    limit becomes the weights + the KV budget + headroom (an overrun fails an allocation),
    set once the batch (whose generator resets the wired limit) is built."""
    settings = RankSettings(model=ModelSettings(path=str(tiny_model_dir)),
                            serving=ServingSettings(**serving), kv_budget_bytes=placed)
    group = mx.distributed.init()
    previous = mx.set_memory_limit(0)
    try:
        loaded = load_and_sync(settings, group, FaultPlan([], 0))
        weights = mx.get_active_memory()
        batch = make_batch(settings, loaded, group)
        assert batch.kv is not None and batch.kv.budgets == [budget]
        assert mx.set_memory_limit(0) == weights + budget + MIN_HEADROOM_BYTES
        batch.close()
    finally:
        mx.set_memory_limit(previous)
