"""What a model's layers weigh and what its KV cache costs, from its config alone.

Placement splits by bytes, not by layer count: MoE layers, dense first layers, the
embeddings and the LM head weigh differently. Parameter counts come from the config's
shapes (attention, multi-head latent attention, dense or mixture-of-experts MLPs);
bytes from the quantization (bits plus a 16-bit scale and bias per group) or 16-bit
weights. Where the files' real size is known, placement scales these counts to it. The
KV cache's bytes are contract/kv_cache.py's, which the ranks' admission shares.
"""

from __future__ import annotations

from dataclasses import dataclass

from contract.fingerprint import ModelConfigInfo
from contract.kv_cache import KvLayout, head_dim, sequence_kv_bytes


class UnknownShape(ValueError):
    """The config lacks a number the estimate needs."""


@dataclass(frozen=True)
class ModelShape:
    layer_params: list[int]  # each decoder layer, in the model's layer numbering
    shared_params: int  # embeddings, final norm, LM head: every pipeline stage holds them

    @property
    def total_params(self) -> int:
        return sum(self.layer_params) + self.shared_params


def model_shape(config: ModelConfigInfo) -> ModelShape:
    hidden, layers, vocab = config.hidden_size, config.num_hidden_layers, config.vocab_size
    if not (hidden and layers and vocab and config.num_attention_heads):
        raise UnknownShape("the config has no hidden_size, num_hidden_layers, vocab_size "
                           "or num_attention_heads")
    types = config.layer_types or ["full_attention"] * layers
    per_layer = [
        _attention_params(config, types[i] if i < len(types) else "full_attention")
        + _mlp_params(config, i)
        + 2 * hidden  # the two RMSNorms
        for i in range(layers)
    ]
    head = 0 if config.tie_word_embeddings else vocab * hidden
    return ModelShape(per_layer, vocab * hidden + head + hidden)


def bytes_per_param(config: ModelConfigInfo) -> float:
    """On disk and in memory: quantized weights carry a 16-bit scale and bias per group."""
    bits = config.quantization_bits
    if not bits:
        return 2.0
    group = config.quantization_group_size or 64
    return bits / 8 + 4 / group


def _attention_params(config: ModelConfigInfo, layer_type: str) -> int:
    hidden, heads = config.hidden_size or 0, config.num_attention_heads or 0
    if config.kv_lora_rank:  # multi-head latent attention
        rope, nope = config.qk_rope_head_dim or 0, config.qk_nope_head_dim or 0
        v_dim = config.v_head_dim or nope
        q_dim = heads * (nope + rope)
        q = (
            hidden * config.q_lora_rank + config.q_lora_rank * q_dim + config.q_lora_rank
            if config.q_lora_rank
            else hidden * q_dim
        )
        kv = hidden * (config.kv_lora_rank + rope) + config.kv_lora_rank * heads * (nope + v_dim)
        return q + kv + config.kv_lora_rank + heads * v_dim * hidden
    dim = head_dim(config)
    kv_heads = config.num_key_value_heads or heads
    # Linear-attention layers (Qwen3-Next) are counted like full ones: close in weight.
    return hidden * dim * (2 * heads + 2 * kv_heads)


def _mlp_params(config: ModelConfigInfo, layer: int) -> int:
    hidden = config.hidden_size or 0
    experts = config.num_experts
    if not experts or layer < config.first_dense_layers:
        return 3 * hidden * (config.intermediate_size or 4 * hidden)
    width = config.moe_intermediate_size or config.intermediate_size or 0
    return (experts + config.num_shared_experts) * 3 * hidden * width + hidden * experts


def kv_bytes(config: ModelConfigInfo, layers: range, tokens: int, tensor_ranks: int = 1) -> int:
    """KV bytes of `tokens` tokens of one sequence in `layers` (contract/kv_cache.py)."""
    return sequence_kv_bytes(config, KvLayout(layers, tensor_ranks), tokens)
