"""Which layers [serving] kv_bits quantizes, what it refuses at start-up, and the forced
output's sampler (whose logprobs stay the model's: the quality bench reads them)."""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import pytest
from mlx_lm.models import llama
from mlx_lm.models.cache import ArraysCache, RotatingKVCache

from serving.engine.kv_quant import KVQuantUnsupported, check_model, fresh_cache
from serving.engine.quantized_cache import SequenceKVCache
from serving.engine.sampling import make_request_processors, make_request_sampler
from serving.engine.step_plan import SamplingParams


def _llama(head_dim: int = 64) -> llama.Model:
    return llama.Model(llama.ModelArgs(
        model_type="llama", hidden_size=2 * head_dim, num_hidden_layers=2,
        intermediate_size=32, num_attention_heads=2, num_key_value_heads=1,
        rms_norm_eps=1e-5, vocab_size=32))


class _Mixed(llama.Model):
    """A model whose second layer keeps a sliding-window cache."""

    def make_cache(self) -> list[Any]:
        return [llama.KVCache(), RotatingKVCache(max_size=8)]


def test_full_attention_layers_quantized_the_others_kept() -> None:
    """A sliding-window layer keeps its rotating cache; the full-attention one is packed."""
    model = _Mixed(_llama().args)
    caches = fresh_cache(model, 4, 64)
    assert [type(c) for c in caches] == [SequenceKVCache, RotatingKVCache]
    assert "1 of 2 layer caches quantized" in check_model(model, 64)


def test_a_model_with_nothing_to_quantize_or_an_odd_head_size_is_refused() -> None:
    """No full-attention layer, or a group size that does not divide the head size: the
    rank refuses at start-up, saying why and what to set."""
    with pytest.raises(KVQuantUnsupported, match="kv_group_size 128 does not divide"):
        check_model(_llama(head_dim=64), 128)
    linear = _llama()
    linear.make_cache = lambda: [ArraysCache(2), ArraysCache(2)]  # type: ignore[method-assign]
    with pytest.raises(KVQuantUnsupported, match="none of this model's layers"):
        check_model(linear, 64)


def test_forced_output_samples_its_tokens_and_leaves_the_logprobs() -> None:
    """Without a reasoning budget the forced tokens come from the sampler, then EOS; no
    logits processor rewrites the model's logprobs."""
    params = SamplingParams(0.0, 1.0, 0, 8, 0, forced=[5, 7])
    sampler = make_request_sampler(params, 32, eos_token_id=2)
    logprobs = mx.zeros((1, 32))
    assert [sampler(logprobs).item() for _ in range(4)] == [5, 7, 2, 2]
    assert make_request_processors(params, 2) == []
