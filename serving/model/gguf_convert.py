"""Convert a llama-architecture GGUF file into an mlx-lm model directory.

MLX reads GGUF natively: `mx.load(path, return_metadata=True)` gives the weights already
in MLX's affine quantized layout (weight/scales/biases) plus the GGUF metadata. What is
left is renaming tensors to mlx-lm's Llama names, writing a config.json that tells
mlx-lm which bits each layer uses, and rebuilding the Hugging Face tokenizer files from
the vocabulary, merges and chat template stored in the metadata.

Only what the bundled demo model needs is supported (llama architecture, GPT-2 style
BPE tokenizer, affine quantization); anything else is refused with a clear error rather
than converted wrongly.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from serving.model.gguf_tokenizer import write_tokenizer_files

if TYPE_CHECKING:
    import mlx.core as mx

# Bumped whenever the output of this converter changes, so cached conversions made by
# an older version are not reused (the cache directory name includes it).
CONVERTER_VERSION = 1

WEIGHTS_FILE = "model.safetensors"

_GLOBAL_NAMES = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}
_BLOCK_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_norm": "input_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "ffn_norm": "post_attention_layernorm",
}
_BLOCK_RE = re.compile(r"^blk\.(\d+)\.([a-z_]+)\.(weight|scales|biases|bias)$")
_GLOBAL_RE = re.compile(r"^([a-z_]+)\.(weight|scales|biases|bias)$")


class GGUFConversionError(Exception):
    """The GGUF file cannot be converted (unsupported architecture, tensor or layout)."""


def convert_gguf(gguf_path: Path, dest: Path) -> None:
    """Write an mlx-lm model directory for `gguf_path` into the existing directory `dest`."""
    import mlx.core as mx

    loaded = mx.load(str(gguf_path), return_metadata=True)
    tensors, metadata = cast(tuple[dict[str, mx.array], dict[str, Any]], loaded)
    arch = metadata.get("general.architecture")
    if arch != "llama":
        raise GGUFConversionError(f"{gguf_path}: architecture {arch!r} is not supported")
    # Dtypes are kept as stored: float32 norms keep activations in float32, which MLX's
    # CPU backend runs ~30x faster than float16 and which matches llama.cpp's answers.
    weights = {_mlx_name(name): array for name, array in tensors.items()}
    config = _model_config(metadata, weights)
    mx.save_safetensors(str(dest / WEIGHTS_FILE), weights, metadata={"format": "mlx"})
    _write_json(dest / "model.safetensors.index.json", _weight_index(weights))
    _write_json(dest / "config.json", config)
    write_tokenizer_files(metadata, dest, context_length=config["max_position_embeddings"])


def _mlx_name(gguf_name: str) -> str:
    """Map a GGUF tensor name (blk.3.attn_q.scales) to mlx-lm's (model.layers.3...)."""
    if match := _BLOCK_RE.match(gguf_name):
        block, part, suffix = match.groups()
        if part in _BLOCK_NAMES:
            return f"model.layers.{block}.{_BLOCK_NAMES[part]}.{suffix}"
    elif (match := _GLOBAL_RE.match(gguf_name)) and match.group(1) in _GLOBAL_NAMES:
        return f"{_GLOBAL_NAMES[match.group(1)]}.{match.group(2)}"
    # Silently dropping a tensor would give a model that loads but answers nonsense.
    raise GGUFConversionError(f"unsupported GGUF tensor {gguf_name!r}")


def _model_config(metadata: dict[str, Any], weights: dict[str, mx.array]) -> dict[str, Any]:
    """The mlx-lm config.json for a llama GGUF."""

    def meta(key: str) -> Any:
        if key not in metadata:
            raise GGUFConversionError(f"GGUF metadata lacks {key!r}")
        value = metadata[key]
        return value.item() if hasattr(value, "item") else value

    hidden = int(meta("llama.embedding_length"))
    heads = int(meta("llama.attention.head_count"))
    rotary_dims = metadata.get("llama.rope.dimension_count")
    if rotary_dims is not None and int(rotary_dims.item()) != hidden // heads:
        raise GGUFConversionError(f"partial rotary embedding ({rotary_dims} dims) not supported")
    if str(metadata.get("llama.rope.scaling.type", "none")) != "none":
        raise GGUFConversionError("rope scaling is not supported")
    vocab = metadata.get("llama.vocab_size")
    vocab_size = weights["model.embed_tokens.weight"].shape[0] if vocab is None else vocab.item()
    config: dict[str, Any] = {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": hidden,
        "num_hidden_layers": int(meta("llama.block_count")),
        "intermediate_size": int(meta("llama.feed_forward_length")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(meta("llama.attention.head_count_kv")),
        "rms_norm_eps": float(meta("llama.attention.layer_norm_rms_epsilon")),
        "rope_theta": float(meta("llama.rope.freq_base")),
        # llama.cpp permutes q/k rows into the interleaved rotary layout on export.
        "rope_traditional": True,
        "max_position_embeddings": int(meta("llama.context_length")),
        "vocab_size": int(vocab_size),
        "tie_word_embeddings": "lm_head.weight" not in weights,
        "bos_token_id": int(meta("tokenizer.ggml.bos_token_id")),
        "eos_token_id": int(meta("tokenizer.ggml.eos_token_id")),
    }
    if quantization := _quantization(weights, hidden):
        config["quantization"] = quantization
        config["quantization_config"] = quantization
    return config


def _quantization(weights: dict[str, mx.array], hidden: int) -> dict[str, Any] | None:
    """mlx-lm's quantization config: a default plus per-layer entries that differ from it.

    Bits and group size are read back from the packed shapes: a row of `in_dims` values
    packs into in_dims * bits / 32 uint32 words and has in_dims / group_size scales.
    """
    per_layer: dict[str, dict[str, Any]] = {}
    for name, scales in weights.items():
        if not name.endswith(".scales"):
            continue
        layer = name.removesuffix(".scales")
        packed = weights[f"{layer}.weight"]
        in_dims = _input_dims(layer, hidden, weights)
        per_layer[layer] = {
            "group_size": in_dims // scales.shape[-1],
            "bits": packed.shape[-1] * 32 // in_dims,
        }
    if not per_layer:
        return None
    settings = sorted({(q["group_size"], q["bits"]) for q in per_layer.values()})
    # The most common setting is the default; the rest (the 8-bit embedding) are listed.
    group_size, bits = max(
        settings, key=lambda s: sum((q["group_size"], q["bits"]) == s for q in per_layer.values())
    )
    quantization: dict[str, Any] = {"group_size": group_size, "bits": bits}
    for layer, q in sorted(per_layer.items()):
        if (q["group_size"], q["bits"]) != (group_size, bits):
            quantization[layer] = q
    return quantization


def _input_dims(layer: str, hidden: int, weights: dict[str, mx.array]) -> int:
    """Unpacked input width of a quantized layer (only down_proj reads the FFN width)."""
    if layer.endswith("mlp.down_proj"):
        # The FFN width is the output width of the matching up projection.
        return int(weights[layer.replace("down_proj", "up_proj") + ".weight"].shape[0])
    return hidden


def _weight_index(weights: dict[str, mx.array]) -> dict[str, Any]:
    """The index mlx-lm's sharded/pipeline loaders read to find which file holds a tensor."""
    return {
        "metadata": {"total_size": sum(array.nbytes for array in weights.values())},
        "weight_map": dict.fromkeys(sorted(weights), WEIGHTS_FILE),
    }


def _write_json(path: Path, content: dict[str, Any]) -> None:
    path.write_text(json.dumps(content, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def dequantize_dir(source: Path, dest: Path) -> None:
    """Write a float32 copy of the converted model `source` into `dest` (for a CPU with
    an optimized BLAS, where float32 matmuls beat MLX's quantized ones many times over)."""
    import shutil

    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_lm.utils import dequantize_model, load_model

    model, config = load_model(source)
    dequantize_model(model)
    flat: list[tuple[str, mx.array]] = tree_flatten(model.parameters())  # type: ignore[assignment]
    weights = {name: array.astype(mx.float32) for name, array in flat}
    mx.save_safetensors(str(dest / WEIGHTS_FILE), weights, metadata={"format": "mlx"})
    for key in ("quantization", "quantization_config"):
        config.pop(key, None)
    config["torch_dtype"] = "float32"
    _write_json(dest / "config.json", config)
    _write_json(dest / f"{WEIGHTS_FILE}.index.json", _weight_index(weights))
    for path in source.iterdir():  # the tokenizer files
        if not path.name.startswith(("config.json", "model.safetensors", "conversion.json")):
            shutil.copyfile(path, dest / path.name)
