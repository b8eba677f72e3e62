"""The mirrored batch (serving/engine/batch.py) on the tiny model: what its prefix cache
keeps for reuse."""

from __future__ import annotations

from pathlib import Path


def _served_again(tiny_model_dir: Path, size: int) -> list[int]:
    """Prompts A, B, C answered one after another, then A again: the prompt tokens each
    reused from the prefix cache of `size` entries."""
    from mlx_lm import load

    from serving.engine.batch import MirroredBatch
    from serving.engine.step_plan import Insert, SamplingParams

    model, tokenizer = load(str(tiny_model_dir))[:2]
    batch = MirroredBatch(model, {0}, len(tokenizer.vocab), max_batch_size=2,
                          prefill_step_size=64, prompt_cache_size=size)
    params = SamplingParams(temperature=0.0, top_p=1.0, top_k=0, max_tokens=2, seed=1)
    reused = []
    for first in (10, 20, 30, 10):
        before = batch.cached_tokens
        batch.apply([Insert("r", list(range(first, first + 12)), params)], [])
        while batch.active:
            batch.step()
        reused.append(batch.cached_tokens - before)
    return reused


def test_prompt_cache_size_bounds_the_finished_sequences_kept(tiny_model_dir: Path) -> None:
    """prompt_cache_size = 3 keeps A through B and C (A's prompt reused); 2 has evicted A
    by then; 0 keeps none (docs/configuration.md)."""
    assert _served_again(tiny_model_dir, 3) == [0, 0, 0, 11]  # the last token recomputed
    assert _served_again(tiny_model_dir, 2) == [0, 0, 0, 0]
    assert _served_again(tiny_model_dir, 0) == [0, 0, 0, 0]


def test_running_sequences_evict_the_prefix_cache_within_the_kv_budget(
    tiny_model_dir: Path,
) -> None:
    """A finished sequence stays in the prefix cache while the budget has room; a running
    sequence whose prompt + max_tokens need that room evicts it (on every rank alike)."""
    import json

    from mlx_lm import load

    from contract.kv_cache import KvLayout
    from contract.model_config import config_info
    from serving.engine.batch import MirroredBatch
    from serving.engine.kv_budget import KvBudget
    from serving.engine.step_plan import Insert, SamplingParams

    model, tokenizer = load(str(tiny_model_dir))[:2]
    config = config_info(json.loads((tiny_model_dir / "config.json").read_text()))
    step = 2 * 2 * 4 * 8 * 4 * 256  # one 256-token step of the tiny model's float32 KV
    kv = KvBudget(config, [KvLayout(range(2), element_bytes=4)], [2 * step])
    batch = MirroredBatch(model, {0}, len(tokenizer.vocab), max_batch_size=2,
                          prefill_step_size=64, prompt_cache_size=4, kv=kv)

    def run(prompt: list[int], max_tokens: int) -> None:
        params = SamplingParams(temperature=0.0, top_p=1.0, top_k=0, max_tokens=max_tokens,
                                seed=1)
        batch.apply([Insert("r", prompt, params)], [])
        while batch.active:
            batch.step()

    run(list(range(10, 22)), 2)
    assert batch.prompt_cache_bytes > 0  # kept: one step of two is free
    params = SamplingParams(temperature=0.0, top_p=1.0, top_k=0, max_tokens=300, seed=1)
    batch.apply([Insert("s", list(range(100, 312)), params)], [])  # 512 tokens: both steps
    assert batch.prompt_cache_bytes == 0
    batch.close()
