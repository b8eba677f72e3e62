"""Reads the numbers placement needs from a model's config.json (Hugging Face / mlx-lm
layout) into a ModelConfigInfo. Architectures name the same thing differently (experts:
num_experts, n_routed_experts, num_local_experts); this is the one place that knows.

A config.json comes from a model repository, i.e. from anyone: every number is bounded
(BOUNDS, far beyond any real model's) before placement multiplies or loops over it, and one
out of range is a ModelConfigError naming the field."""

from __future__ import annotations

from typing import Any

from contract.fingerprint import ModelConfigInfo

K, M = 1 << 10, 1 << 20
# field: (least, most). The core shape must be positive; counts that a dense model may
# give as 0 may be 0. Largest real values today: ~200 layers, 256k vocab, 10M context.
_SHAPE = (1, M)
BOUNDS: dict[str, tuple[int, int]] = {
    "num_hidden_layers": (1, 4 * K),
    "num_attention_heads": (1, 16 * K),
    "num_key_value_heads": (1, 16 * K),
    "hidden_size": _SHAPE,
    "head_dim": _SHAPE,
    "intermediate_size": _SHAPE,
    "moe_intermediate_size": _SHAPE,
    "kv_lora_rank": _SHAPE,
    "q_lora_rank": _SHAPE,
    "qk_rope_head_dim": _SHAPE,
    "qk_nope_head_dim": _SHAPE,
    "v_head_dim": _SHAPE,
    "vocab_size": (1, 64 * M),
    "max_position_embeddings": (1, 1 << 31),
    "sliding_window": (0, 1 << 31),
    "full_attention_interval": (0, 4 * K),
    "first_k_dense_replace": (0, 4 * K),
    "bits": (1, 32),
    "group_size": (1, 64 * K),
}
_COUNTS = (0, 64 * K)  # experts: routed, per token, shared


class ModelConfigError(ValueError):
    """A number in a model's config.json is out of any real model's range."""


def _checked(key: str, value: object, where: str) -> int | None:
    if not isinstance(value, int) or isinstance(value, bool):
        return None
    least, most = BOUNDS.get(key, _COUNTS)
    if not least <= value <= most:
        raise ModelConfigError(
            f"{where}: {key} = {value} is outside {least}..{most}, which no real model "
            "needs: the file is damaged or hostile (fix or re-pull the model)"
        )
    return value


def config_info(config: dict[str, Any], source: str = "config.json") -> ModelConfigInfo:
    """Raises ModelConfigError (a ValueError) naming `source` and the field out of range."""
    # Multimodal configs keep the language model's numbers under text_config.
    text = config.get("text_config")
    merged = {**config, **text} if isinstance(text, dict) else config
    _check_interval(merged, source)

    def num(*keys: str) -> int | None:
        for key in keys:
            value = _checked(key, merged.get(key), source)
            if value is not None:
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
        quantization_bits=_checked("bits", quant.get("bits"), f"{source} quantization"),
        quantization_group_size=_checked(
            "group_size", quant.get("group_size"), f"{source} quantization"
        ),
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


def _check_interval(config: dict[str, Any], source: str) -> None:
    """What _layer_types loops over, checked before it does."""
    for key in ("num_hidden_layers", "full_attention_interval"):
        _checked(key, config.get(key), source)
    listed = config.get("layer_types")
    if isinstance(listed, list) and len(listed) > BOUNDS["num_hidden_layers"][1]:
        raise ModelConfigError(f"{source}: layer_types lists {len(listed)} layers: too many")


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
