"""What a model's KV cache costs, from its config alone: per token, per sequence, per rank.

The one computation placement, preflight, `plan` and the ranks' admission share. A rank
holds the KV of its own layers (pipeline) and its share of the KV heads (tensor: mlx-lm's
shard() divides them by the group size; a multi-head latent is not split). Elements are
the activations' dtype (`element_bytes`, else the config's `torch_dtype`, else 16-bit),
or, quantized (`kv_bits`), bits/8 per element plus a scale and a bias per
`kv_group_size` elements (16-bit each in a 16-bit model). mlx-lm allocates a cache in
steps of KV_STEP tokens, and its batched cache pads every sequence to the longest (one
rectangular array per layer).
"""

from __future__ import annotations

from dataclasses import dataclass

from contract.fingerprint import ModelConfigInfo

KV_ELEMENT_BYTES = 2  # mlx-lm keeps keys and values in the activations' 16-bit dtype
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}
KV_STEP = 256  # mlx-lm's KVCache and BatchKVCache grow by this many tokens
# A quantized cache's exact window (`kv_window`) hands its oldest tokens to the quantized
# part in blocks of this many (at most the window), so its buffer holds kv_window +
# window_block(kv_window) tokens.
KV_WINDOW_BLOCK = 32


def window_block(window: int) -> int:
    """Tokens leaving an exact window of `window` at once (1: no window, every token is
    quantized as it is stored)."""
    return min(KV_WINDOW_BLOCK, window) if window > 0 else 1


@dataclass(frozen=True)
class KvLayout:
    """How one rank's cache is laid out: which layers, what share of the heads, what bytes."""

    layers: range
    tensor_ranks: int = 1
    kv_bits: int | None = None
    kv_group_size: int = 64
    element_bytes: int | None = None  # None: from the config's dtype
    kv_window: int = 0  # quantized: the most recent tokens kept exact ([serving] kv_window)


def allocated_tokens(tokens: int) -> int:
    """What mlx-lm allocates for `tokens` tokens: whole steps of KV_STEP."""
    return -(-max(tokens, 0) // KV_STEP) * KV_STEP


def head_dim(config: ModelConfigInfo) -> int:
    if config.head_dim:
        return config.head_dim
    assert config.hidden_size and config.num_attention_heads
    return config.hidden_size // config.num_attention_heads


def element_bytes(config: ModelConfigInfo) -> int:
    return DTYPE_BYTES.get(config.dtype or "", KV_ELEMENT_BYTES)


def _layer_kind(config: ModelConfigInfo, layer: int) -> str:
    types = config.layer_types or []
    return types[layer] if layer < len(types) else "full_attention"


def layer_elements(config: ModelConfigInfo, layer: int, tensor_ranks: int = 1) -> int:
    """Keys' and values' elements one token adds to one layer's cache on one rank (0 for
    linear-attention layers, whose state does not grow)."""
    if _layer_kind(config, layer) == "linear_attention":
        return 0
    if config.kv_lora_rank:  # one compressed latent plus the rotary key part, on every rank
        return config.kv_lora_rank + (config.qk_rope_head_dim or 0)
    kv_heads = config.num_key_value_heads or config.num_attention_heads or 0
    return 2 * -(-kv_heads // max(tensor_ranks, 1)) * head_dim(config)


def _bytes(elements: int, layout: KvLayout, config: ModelConfigInfo) -> int:
    element = layout.element_bytes or element_bytes(config)
    if layout.kv_bits is None:
        return elements * element
    groups = -(-elements // layout.kv_group_size)  # a scale and a bias each, in the dtype
    return elements * layout.kv_bits // 8 + groups * 2 * element


def kv_bytes_per_token(config: ModelConfigInfo, layout: KvLayout) -> int:
    """KV bytes one token adds to the rank's growing layers (sliding layers included:
    below their window they grow like full ones)."""
    return sum(
        _bytes(layer_elements(config, layer, layout.tensor_ranks), layout, config)
        for layer in layout.layers
    )


def sequence_kv_bytes(config: ModelConfigInfo, layout: KvLayout, tokens: int) -> int:
    """KV bytes of one sequence of `tokens` tokens on the rank; a sliding-window layer
    keeps at most its window. Quantized with an exact window, a full-attention layer
    also holds the window's buffer (kv_window + window_block tokens in the activations'
    dtype) beside room for all its tokens quantized (a little more than it uses)."""
    total = 0
    exact = KvLayout(layout.layers, layout.tensor_ranks, None, element_bytes=layout.element_bytes)
    for layer in layout.layers:
        kept = tokens
        elements = layer_elements(config, layer, layout.tensor_ranks)
        if _layer_kind(config, layer) == "sliding_attention" and config.sliding_window:
            kept = min(tokens, config.sliding_window)
        elif layout.kv_bits is not None and layout.kv_window and kept:
            room = layout.kv_window + window_block(layout.kv_window)
            total += _bytes(elements, exact, config) * room
        total += _bytes(elements, layout, config) * kept
    return total


def batch_kv_bytes(config: ModelConfigInfo, layout: KvLayout, tokens: list[int]) -> int:
    """The KV of a batch of sequences that each grow to `tokens[i]`: mlx-lm pads them all
    to the longest, allocated in whole steps."""
    if not tokens:
        return 0
    return len(tokens) * sequence_kv_bytes(config, layout, allocated_tokens(max(tokens)))


def pipeline_layers(split: list[int]) -> list[range]:
    """Each rank's layers from per-rank counts, in mlx-lm's order: rank 0 runs the last."""
    return [
        range(sum(split[rank + 1:]), sum(split[rank + 1:]) + split[rank])
        for rank in range(len(split))
    ]


def rank_layouts(
    config: ModelConfigInfo, ranks: int, split: list[int] | None, *,
    kv_bits: int | None, kv_group_size: int, element_bytes: int | None = None,
    kv_window: int = 0,
) -> list[KvLayout]:
    """Every rank's layout: tensor (all layers, a share of the heads) or pipeline (its
    own layers, all heads)."""
    if split and ranks > 1:
        return [KvLayout(span, 1, kv_bits, kv_group_size, element_bytes, kv_window)
                for span in pipeline_layers(split)]
    every = range(config.num_hidden_layers or 0)
    return [KvLayout(every, ranks, kv_bits, kv_group_size, element_bytes, kv_window)] * ranks
