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
