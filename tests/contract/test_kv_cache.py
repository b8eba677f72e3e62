"""The KV bytes computation against real mlx-lm caches after a prefill, and per rank."""

from __future__ import annotations

import json
from pathlib import Path

import mlx.core as mx
from mlx_lm import load
from mlx_lm.models.cache import make_prompt_cache

from contract.kv_cache import (
    KvLayout,
    allocated_tokens,
    batch_kv_bytes,
    kv_bytes_per_token,
    rank_layouts,
    sequence_kv_bytes,
)
from contract.model_config import config_info
from serving.engine.batch import MirroredBatch
from serving.engine.step_plan import Insert, SamplingParams
from serving.rank.kv_setup import activation_bytes
from testkit.tiny_model import write_tiny_model


def prefilled(model_dir: Path, tokens: int) -> tuple[object, list[object]]:
    model, _ = load(str(model_dir))[:2]
    cache = make_prompt_cache(model)
    model(mx.array([list(range(1, tokens + 1))]), cache=cache)
    mx.eval([c.state for c in cache])
    return model, cache


def test_a_sequence_costs_what_mlx_lm_allocates(tiny_model_dir: Path) -> None:
    """300 prompt tokens: the formula's bytes equal the real cache's nbytes (whole steps
    of 256 tokens, float32 activations, 4 KV heads of 8 in each of 2 layers)."""
    model, cache = prefilled(tiny_model_dir, 300)
    config = config_info(json.loads((tiny_model_dir / "config.json").read_text()))
    layout = KvLayout(range(2), element_bytes=activation_bytes(model))
    assert activation_bytes(model) == 4
    real = sum(c.nbytes for c in cache)  # type: ignore[attr-defined]
    assert sequence_kv_bytes(config, layout, allocated_tokens(300)) == real
    assert real == 2 * 2 * 4 * 8 * 4 * 512  # layers x (K, V) x heads x head_dim x 4 B x 512


def test_a_quantized_sequence_costs_what_mlx_lm_quantizes_it_to(tmp_path: Path) -> None:
    """kv_bits 4, groups of 32: the formula equals mlx-lm's QuantizedKVCache's nbytes."""
    model_dir = write_tiny_model(tmp_path, hidden_size=256, num_heads=4, num_kv_heads=2)
    model, cache = prefilled(model_dir, 300)
    quantized = [c.to_quantized(group_size=32, bits=4) for c in cache]  # type: ignore[attr-defined]
    config = config_info(json.loads((model_dir / "config.json").read_text()))
    layout = KvLayout(range(2), kv_bits=4, kv_group_size=32, element_bytes=activation_bytes(model))
    assert sequence_kv_bytes(config, layout, allocated_tokens(300)) == sum(
        c.nbytes for c in quantized)


def test_a_batch_pads_to_its_longest_sequence(tiny_model_dir: Path) -> None:
    """Two sequences of 43 and 303 tokens in mlx-lm's batched cache cost twice the longer:
    the batch formula equals the generator's real cache."""
    model, _ = load(str(tiny_model_dir))[:2]
    config = config_info(json.loads((tiny_model_dir / "config.json").read_text()))
    batch = MirroredBatch(model, {2}, config.vocab_size or 0, 4, 512)
    params = SamplingParams(temperature=0.0, top_p=1.0, top_k=0, max_tokens=20, seed=1)
    batch.apply([Insert("a", list(range(1, 41)), params),
                 Insert("b", list(range(1, 301)), params)], [])
    for _ in range(3):
        batch.step()
    cache = batch.generator._generation_batch.prompt_cache  # mlx-lm 0.32's BatchKVCache list
    layout = KvLayout(range(2), element_bytes=activation_bytes(model))
    assert batch_kv_bytes(config, layout, [43, 303]) == sum(c.nbytes for c in cache)
    batch.close()


def test_a_quantized_batch_with_its_exact_window_stays_within_the_formula(
        tmp_path: Path) -> None:
    """kv_bits 4 with a window of 16: the generator's real cache (packed part and the
    window's exact buffer) is at most what admission counts, and not a step less."""
    model_dir = write_tiny_model(tmp_path, hidden_size=256, num_heads=4, num_kv_heads=2)
    model, _ = load(str(model_dir))[:2]
    config = config_info(json.loads((model_dir / "config.json").read_text()))
    batch = MirroredBatch(model, {2}, config.vocab_size or 0, 4, 512, kv_bits=4,
                          kv_group_size=64, kv_window=16)
    params = SamplingParams(temperature=0.0, top_p=1.0, top_k=0, max_tokens=20, seed=1)
    batch.apply([Insert("a", list(range(1, 41)), params),
                 Insert("b", list(range(1, 301)), params)], [])
    for _ in range(4):
        batch.step()
    cache = batch.generator._generation_batch.prompt_cache
    assert {c._idx - c._q for c in cache} <= set(range(16, 32))  # the window, exact
    layout = KvLayout(range(2), kv_bits=4, element_bytes=activation_bytes(model), kv_window=16)
    real = sum(c.nbytes for c in cache)
    counted = batch_kv_bytes(config, layout, [43, 303])
    # Never under; over by less than a step of packed tokens per row (the step a
    # sequence's allocation is rounded up to).
    packed_steps = batch_kv_bytes(config, KvLayout(range(2), kv_bits=4, element_bytes=4),
                                  [256, 256])
    assert counted - packed_steps < real <= counted
    batch.close()


def test_ranks_hold_their_heads_or_their_layers() -> None:
    """Tensor: every layer, a share of the KV heads; pipeline: its own layers in mlx-lm's
    order (rank 0 the last); both add up to the whole model's KV."""
    config = config_info({"num_hidden_layers": 10, "num_attention_heads": 8,
                          "num_key_value_heads": 4, "hidden_size": 512,
                          "torch_dtype": "bfloat16"})
    whole = kv_bytes_per_token(config, KvLayout(range(10)))
    assert whole == 10 * 2 * 4 * 64 * 2
    tensor = rank_layouts(config, 2, None, kv_bits=None, kv_group_size=64)
    assert [kv_bytes_per_token(config, t) for t in tensor] == [whole // 2] * 2
    pipeline = rank_layouts(config, 2, [3, 7], kv_bits=None, kv_group_size=64)
    assert [p.layers for p in pipeline] == [range(7, 10), range(0, 7)]
    assert sum(kv_bytes_per_token(config, p) for p in pipeline) == whole
    float32 = config_info({"torch_dtype": "float32", "num_hidden_layers": 1,
                           "num_attention_heads": 1, "hidden_size": 64})
    assert kv_bytes_per_token(float32, KvLayout(range(1))) == 2 * 64 * 4
