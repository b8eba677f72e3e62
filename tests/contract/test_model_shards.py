"""Which files a pipeline stage needs, read from an mlx-lm index as sharded_load reads it."""

from __future__ import annotations

import json
import re

import pytest

from contract.model_shards import (
    INDEX_FILE,
    ShardIndexError,
    WeightShard,
    index_total_size,
    needed_files,
    parse_index,
)

INDEX = json.dumps(
    {
        "metadata": {"total_size": 1234},
        "weight_map": {
            "model.embed_tokens.weight": "a.safetensors",
            "model.layers.0.mlp.up_proj.weight": "a.safetensors",
            "model.layers.1.mlp.up_proj.weight": "b.safetensors",
            "model.layers.2.self_attn.q_proj.weight": "b.safetensors",
            "model.layers.3.mlp.up_proj.weight": "c.safetensors",
            "model.norm.weight": "d.safetensors",
            "lm_head.weight": "d.safetensors",
        },
    }
)
FILES = ["a.safetensors", "b.safetensors", "c.safetensors", "config.json", "d.safetensors",
         "model.safetensors.index.json", "tokenizer.json"]


def test_index_gives_each_shards_layers_and_the_shared_ones() -> None:
    """Layer numbers come from `layers.N.`; any other tensor makes its shard shared."""
    assert parse_index(INDEX) == [
        WeightShard(path="a.safetensors", layers=[0], shared=True),
        WeightShard(path="b.safetensors", layers=[1, 2]),
        WeightShard(path="c.safetensors", layers=[3]),
        WeightShard(path="d.safetensors", layers=[], shared=True),
    ]
    assert index_total_size(INDEX) == 1234 and index_total_size("{}") is None


def test_a_stage_needs_its_layers_shards_the_shared_ones_and_every_other_file() -> None:
    """Layers [3, 4): c plus the shared a and d, config, tokenizer, index; None: all."""
    shards = parse_index(INDEX)
    assert needed_files(FILES, shards, (3, 4)) == [
        "a.safetensors", "c.safetensors", "config.json", "d.safetensors",
        "model.safetensors.index.json", "tokenizer.json",
    ]
    assert "b.safetensors" in needed_files(FILES, shards, (2, 3))
    assert needed_files(FILES, shards, None) == sorted(FILES)
    # A weights file the index does not name is loaded by mlx-lm's glob: every stage.
    assert "extra.safetensors" in needed_files([*FILES, "extra.safetensors"], shards, (3, 4))


@pytest.mark.parametrize("text", ["not json", "{}", '{"weight_map": [1]}',
                                  '{"weight_map": {"x": 3}}'])
def test_a_malformed_index_is_refused_by_name(text: str) -> None:
    """The message names the index file."""
    with pytest.raises(ShardIndexError, match=re.escape(INDEX_FILE)):
        parse_index(text)
