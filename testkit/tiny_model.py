"""A tiny random-weight Llama (or dense Qwen3) in mlx-lm format, for fast tests of
loading and serving.

It uses the bundled model's tokenizer (chat template, special tokens and all), so code
under test sees a real tokenizer while the forward pass costs almost nothing. Its output
is gibberish but deterministic: the weights are a pure function of the arguments.

The default 8 attention heads / 4 KV heads shard at 1, 2 and 4 ranks (mlx-lm's Llama
`shard()` divides both head counts by the group size).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from contract.model_ref import BUNDLED_PREFIX
from serving.model.bundled import resolve_model

if TYPE_CHECKING:
    import mlx.core as mx

TOKENIZER_SOURCE = BUNDLED_PREFIX + "smollm2-135m-instruct"
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "generation_config.json",
)
WEIGHTS_FILE = "model.safetensors"


def write_tiny_model(
    dest: Path,
    *,
    num_heads: int = 8,
    num_kv_heads: int = 4,
    num_layers: int = 2,
    hidden_size: int = 64,
    seed: int = 0,
    model_cache_dir: Path | None = None,
    model_type: str = "llama",
    vocab_size: int | None = None,
    head_scale: float = 1.0,
) -> Path:
    """Write a random-weight Llama into `dest` (created if needed) and return `dest`.

    `model_cache_dir` is where the bundled model (the tokenizer's source) is converted;
    None means the default cache. `model_type` "qwen3" writes a dense Qwen3 instead (its
    attention adds per-head q/k norms). `vocab_size`: embedding rows other than the
    tokenizer's (a model of another vocabulary). `head_scale` multiplies the
    output head: greedy choices stay, the distribution sharpens (at 8, the top token
    takes ~2/3 of it: sampling at a low temperature mostly follows greedy)."""
    if model_type not in ("llama", "qwen3"):
        raise ValueError(f"model_type {model_type!r}: the tiny model is 'llama' or 'qwen3'")
    if hidden_size % num_heads or num_heads % num_kv_heads:
        raise ValueError(
            f"hidden_size {hidden_size} must divide by num_heads {num_heads}, "
            f"which must divide by num_kv_heads {num_kv_heads}"
        )
    source = resolve_model(TOKENIZER_SOURCE, model_cache_dir)
    source_config = json.loads((source / "config.json").read_text(encoding="utf-8"))
    dest.mkdir(parents=True, exist_ok=True)
    for name in TOKENIZER_FILES:
        shutil.copyfile(source / name, dest / name)
    config = _config(source_config, num_heads, num_kv_heads, num_layers, hidden_size)
    if model_type == "qwen3":
        config |= {"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"],
                   "head_dim": hidden_size // num_heads}
    config["vocab_size"] = vocab_size or config["vocab_size"]
    controls = [i for i in _control_token_ids(source) if i < config["vocab_size"]]
    weights = _random_weights(config, controls, seed)
    weights["lm_head.weight"] = weights["lm_head.weight"] * head_scale
    _save(dest, config, weights)
    return dest


def _config(
    source: dict[str, Any], num_heads: int, num_kv_heads: int, num_layers: int, hidden: int
) -> dict[str, Any]:
    return {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": hidden,
        "num_hidden_layers": num_layers,
        "intermediate_size": 2 * hidden,
        "num_attention_heads": num_heads,
        "num_key_value_heads": num_kv_heads,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "max_position_embeddings": 4096,
        "vocab_size": source["vocab_size"],
        # A separate random head maps each state to an unrelated token; tied embeddings
        # would make the model echo its last input token forever.
        "tie_word_embeddings": False,
        "bos_token_id": source["bos_token_id"],
        "eos_token_id": source["eos_token_id"],
    }


def _control_token_ids(source: Path) -> list[int]:
    """Ids of the tokenizer's special tokens (EOS among them)."""
    tokenizer = json.loads((source / "tokenizer.json").read_text(encoding="utf-8"))
    return sorted(int(tok["id"]) for tok in tokenizer["added_tokens"] if tok.get("special"))


def _random_weights(
    config: dict[str, Any], control_ids: list[int], seed: int
) -> dict[str, mx.array]:
    """Unit-variance embeddings, Normal(0, 1/fan_in) matrices and unit norms, drawn from
    one key per tensor."""
    import mlx.core as mx

    hidden = config["hidden_size"]
    head_dim = hidden // config["num_attention_heads"]
    kv = config["num_key_value_heads"] * head_dim
    ffn = config["intermediate_size"]
    shapes: dict[str, tuple[int, ...]] = {
        "model.embed_tokens.weight": (config["vocab_size"], hidden),
        "lm_head.weight": (config["vocab_size"], hidden),
    }
    for i in range(config["num_hidden_layers"]):
        layer = f"model.layers.{i}"
        shapes |= {
            f"{layer}.self_attn.q_proj.weight": (hidden, hidden),
            f"{layer}.self_attn.k_proj.weight": (kv, hidden),
            f"{layer}.self_attn.v_proj.weight": (kv, hidden),
            f"{layer}.self_attn.o_proj.weight": (hidden, hidden),
            f"{layer}.mlp.gate_proj.weight": (ffn, hidden),
            f"{layer}.mlp.up_proj.weight": (ffn, hidden),
            f"{layer}.mlp.down_proj.weight": (hidden, ffn),
        }
    keys = mx.random.split(mx.random.key(seed), len(shapes))
    weights = {
        name: mx.random.normal(shape, key=keys[i]) * (1.0 if "embed" in name else shape[1] ** -0.5)
        for i, (name, shape) in enumerate(shapes.items())
    }
    # A zero head row gives that token a zero logit, far below the top of ~50k random
    # logits: greedy decoding never picks EOS and always runs to max_tokens.
    weights["lm_head.weight"][mx.array(control_ids)] = 0.0
    for i in range(config["num_hidden_layers"]):
        for norm in ("input_layernorm", "post_attention_layernorm"):
            weights[f"model.layers.{i}.{norm}.weight"] = mx.ones((hidden,))
        if config["model_type"] == "qwen3":
            for norm in ("q_norm", "k_norm"):
                weights[f"model.layers.{i}.self_attn.{norm}.weight"] = mx.ones((head_dim,))
    weights["model.norm.weight"] = mx.ones((hidden,))
    return weights


def _save(dest: Path, config: dict[str, Any], weights: dict[str, mx.array]) -> None:
    import mlx.core as mx

    mx.save_safetensors(str(dest / WEIGHTS_FILE), weights, metadata={"format": "mlx"})
    index = {
        "metadata": {"total_size": sum(w.nbytes for w in weights.values())},
        "weight_map": dict.fromkeys(sorted(weights), WEIGHTS_FILE),
    }
    for name, content in (("config.json", config), ("model.safetensors.index.json", index)):
        (dest / name).write_text(json.dumps(content, indent=2) + "\n", encoding="utf-8")


def write_draft_model(target: Path, dest: Path, scale: float = 0.9) -> Path:
    """A copy of the tiny model at `target` with its last layer's MLP output scaled by
    `scale`, into `dest`: a draft model that proposes the target's greedy token most of
    the time but not always (at 0.9, 22 of the default model's first 24 tokens of
    tests/serving/engine/test_speculative.py's prompt), so speculation both keeps and
    rejects drafts."""
    import mlx.core as mx

    shutil.copytree(target, dest)
    config = json.loads((target / "config.json").read_text(encoding="utf-8"))
    name = f"model.layers.{config['num_hidden_layers'] - 1}.mlp.down_proj.weight"
    loaded = mx.load(str(target / WEIGHTS_FILE))
    assert isinstance(loaded, dict)  # a safetensors file: name -> array
    weights = dict(loaded)
    weights[name] = weights[name] * scale
    _save(dest, config, weights)
    return dest
