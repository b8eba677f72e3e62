"""Reads the numbers placement needs from a model's config.json (Hugging Face / mlx-lm
layout) into a ModelConfigInfo. Architectures name the same thing differently (experts:
num_experts, n_routed_experts, num_local_experts); this is the one place that knows."""

from __future__ import annotations

from typing import Any

from contract.fingerprint import ModelConfigInfo


def config_info(config: dict[str, Any]) -> ModelConfigInfo:
    # Multimodal configs keep the language model's numbers under text_config.
    text = config.get("text_config")
    merged = {**config, **text} if isinstance(text, dict) else config

    def num(*keys: str) -> int | None:
        for key in keys:
            value = merged.get(key)
            if isinstance(value, int) and not isinstance(value, bool):
                return value
        return None

    quant = merged.get("quantization") or merged.get("quantization_config")
    quant = quant if isinstance(quant, dict) else {}
    heads = num("num_attention_heads")
    model_type = merged.get("model_type")
    layer_types = merged.get("layer_types")
    return ModelConfigInfo(
        model_type=model_type if isinstance(model_type, str) else None,
        num_attention_heads=heads,
        # Llama-style configs omit it when there is no grouped-query attention.
        num_key_value_heads=num("num_key_value_heads") or heads,
        num_hidden_layers=num("num_hidden_layers"),
        hidden_size=num("hidden_size"),
        vocab_size=num("vocab_size"),
        max_position_embeddings=num("max_position_embeddings"),
        quantization_bits=_int(quant.get("bits")),
        quantization_group_size=_int(quant.get("group_size")),
        head_dim=num("head_dim"),
        intermediate_size=num("intermediate_size"),
        tie_word_embeddings=merged.get("tie_word_embeddings") is True,
        num_experts=num("n_routed_experts", "num_experts", "num_local_experts"),
        num_experts_per_tok=num("num_experts_per_tok", "experts_per_token"),
        num_shared_experts=num("n_shared_experts", "num_shared_experts") or 0,
        moe_intermediate_size=num("moe_intermediate_size"),
        first_dense_layers=num("first_k_dense_replace") or 0,
        kv_lora_rank=num("kv_lora_rank"),
        q_lora_rank=num("q_lora_rank"),
        qk_rope_head_dim=num("qk_rope_head_dim"),
        qk_nope_head_dim=num("qk_nope_head_dim"),
        v_head_dim=num("v_head_dim"),
        sliding_window=num("sliding_window"),
        layer_types=_layer_types(merged, layer_types),
        dtype=_str(merged.get("torch_dtype") or merged.get("dtype")),
    )


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _str(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _layer_types(config: dict[str, Any], listed: object) -> list[str] | None:
    if isinstance(listed, list) and all(isinstance(t, str) for t in listed):
        return list(listed)
    layers = config.get("num_hidden_layers")
    interval = config.get("full_attention_interval")  # Qwen3-Next: 1 in N layers is full
    if isinstance(layers, int) and isinstance(interval, int) and interval > 0:
        return [
            "full_attention" if (i + 1) % interval == 0 else "linear_attention"
            for i in range(layers)
        ]
    return None
