"""`[serving] kv_bits`: which of a model's layer caches are quantized, and whether it can be.

A layer whose cache is mlx-lm's plain KVCache (full attention) gets a quantized one
(serving/engine/quantized_cache.py). The other kinds stay as they are, for reasons of
their own: a rotating (sliding-window) cache is bounded by its window already and
mlx-lm's batched rotating cache has no quantized form (its to_quantized raises
NotImplementedError); a linear-attention or state-space layer keeps a fixed-size state,
not keys and values. A model with no full-attention layer, a head size the group size
does not divide, or attention sinks (quantized attention has none) is refused at
start-up with the reason.
"""

from __future__ import annotations

from typing import Any

import mlx.nn as nn
from mlx_lm.models.cache import KVCache, make_prompt_cache

from serving.engine.quantized_cache import SequenceKVCache


class KVQuantUnsupported(Exception):
    """kv_bits is set and this model's cache cannot be quantized (start-up, exit 10)."""


def fresh_cache(model: nn.Module, bits: int, group_size: int, window: int = 0) -> list[Any]:
    """A new sequence's per-layer caches, full-attention layers quantized (the `window`
    most recent tokens kept exact)."""
    return [
        SequenceKVCache(group_size, bits, window) if type(cache) is KVCache else cache
        for cache in make_prompt_cache(model)
    ]


def check_model(model: nn.Module, group_size: int) -> str:
    """Refuse what cannot be quantized; returns what will be, for the log."""
    kinds = [type(cache).__name__ for cache in make_prompt_cache(model)]
    quantized = kinds.count(KVCache.__name__)
    if not quantized:
        raise KVQuantUnsupported(
            f"[serving] kv_bits: none of this model's layers keeps a full-attention KV "
            f"cache ({', '.join(sorted(set(kinds)))}: sliding-window, linear-attention or "
            f"state-space caches are not quantized): remove kv_bits")
    attention = [getattr(layer, "self_attn", None) for layer in getattr(model, "layers", [])]
    if any(getattr(attn, "sinks", None) is not None for attn in attention):
        raise KVQuantUnsupported(
            "[serving] kv_bits: this model's attention has sinks, which quantized "
            "attention does not support: remove kv_bits")
    head_dims = {getattr(attn, "head_dim", 0) for attn in attention}
    odd = sorted(d for d in head_dims if isinstance(d, int) and d % group_size)
    if odd:
        raise KVQuantUnsupported(
            f"[serving] kv_group_size {group_size} does not divide this model's head size "
            f"{odd[0]}: set kv_group_size to 32 (or a divisor of {odd[0]} among 32, 64, 128)")
    left = len(kinds) - quantized
    return f"{quantized} of {len(kinds)} layer caches quantized" + (
        f" ({left} sliding-window or linear-attention layers kept as they are)" if left else "")
