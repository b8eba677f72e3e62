"""Models' config.json as placement and fit read them: the bundled model's numbers, and
real models' configs kept in tests/fixtures/model_configs."""

from __future__ import annotations

from testkit.paths import FIXTURES

SMOLLM2 = {  # the bundled model's numbers
    "model_type": "llama", "hidden_size": 576, "num_hidden_layers": 30,
    "num_attention_heads": 9, "num_key_value_heads": 3, "intermediate_size": 1536,
    "vocab_size": 49152, "tie_word_embeddings": True, "max_position_embeddings": 8192,
}


CONFIGS = FIXTURES / "model_configs"
