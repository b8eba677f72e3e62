"""Memory estimates on published configs, checked against their published sizes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from contract.fingerprint import ModelConfigInfo
from contract.model_config import config_info
from orchestrator.placement.model_size import bytes_per_param, kv_bytes, model_shape

CONFIGS = Path(__file__).parents[2] / "fixtures" / "model_configs"
GB = 1e9


def published(name: str) -> ModelConfigInfo:
    return config_info(json.loads((CONFIGS / f"{name}.json").read_text()))


# Total parameters as each model card states them (without multi-token-prediction layers,
# which mlx-lm drops): 235B, 30.5B, 671B, 1.04T, 355B and 106B (GLM-4.5 and -Air, incl.
# their 1 MTP layer), 116.8B.
@pytest.mark.parametrize(
    ("name", "params", "tolerance"),
    [
        ("Qwen3-235B-A22B", 235e9, 0.01),
        ("Qwen3-30B-A3B", 30.5e9, 0.01),
        ("DeepSeek-V3", 671e9, 0.01),
        ("Kimi-K2-Instruct", 1.04e12, 0.02),
        ("GLM-4.5", 355e9, 0.02),
        ("GLM-4.5-Air", 106e9, 0.02),
        ("gpt-oss-120b", 116.8e9, 0.01),
    ],
)
def test_parameter_counts_match_published_sizes(name: str, params: float, tolerance: float) -> None:
    """Parameters from the config's shapes (MoE experts, MLA, dense first layers,
    untied heads) are within a percent or two of the published totals."""
    total = model_shape(published(name)).total_params
    assert abs(total - params) / params < tolerance, f"{name}: {total / 1e9:.1f}B"


def test_moe_layers_outweigh_dense_first_layers() -> None:
    """DeepSeek-V3's three dense layers weigh a fraction of a MoE layer: a split by
    bytes must not count layers alike."""
    layers = model_shape(published("DeepSeek-V3")).layer_params
    assert layers[0] == layers[2] < layers[3] / 10
    assert len(set(layers[3:])) == 1


def test_four_bit_size_on_disk() -> None:
    """mlx-community's Qwen3-235B-A22B-4bit holds about 132 GB, Qwen3-30B-A3B-4bit
    about 17.2 GB: 4 bits plus a 16-bit scale and bias per 64 weights."""
    for name, size in (("Qwen3-235B-A22B", 132e9), ("Qwen3-30B-A3B", 17.2e9)):
        config = published(name)
        config.quantization_bits, config.quantization_group_size = 4, 64
        estimate = model_shape(config).total_params * bytes_per_param(config)
        assert abs(estimate - size) / size < 0.02, f"{name}: {estimate / GB:.1f} GB"


def test_kv_cache_per_token() -> None:
    """head_dim from the config (Qwen3: 128, not hidden / heads), MLA's compressed latent
    (DeepSeek: 512 + 64 per layer, not 128 heads x 2 x 128), sliding layers capped."""
    qwen = published("Qwen3-235B-A22B")
    assert kv_bytes(qwen, range(94), 1) == 94 * 2 * 4 * 128 * 2
    deepseek = published("DeepSeek-V3")
    assert kv_bytes(deepseek, range(61), 1) == 61 * (512 + 64) * 2
    gpt_oss = published("gpt-oss-120b")
    per_layer = 2 * 8 * 64 * 2
    # 18 sliding layers keep 128 tokens, 18 full layers keep all 100,000.
    assert kv_bytes(gpt_oss, range(36), 100_000) == 18 * per_layer * (128 + 100_000)


def test_hybrid_linear_attention_layers_hold_no_growing_kv() -> None:
    """Qwen3-Next: 1 layer in 4 is full attention; the linear layers' state does not grow."""
    config = config_info({
        "model_type": "qwen3_next", "hidden_size": 2048, "num_hidden_layers": 48,
        "num_attention_heads": 16, "num_key_value_heads": 2, "head_dim": 256,
        "vocab_size": 151936, "full_attention_interval": 4,
    })
    assert kv_bytes(config, range(48), 10) == 12 * 2 * 2 * 256 * 2 * 10
