"""Small model directories on disk for the model probe, store, relay and sync tests: a
config, a tokenizer and valid safetensors files of zeros."""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path

CONFIG = {
    "model_type": "llama",
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "num_hidden_layers": 2,
    "hidden_size": 64,
    "vocab_size": 100,
    "max_position_embeddings": 2048,
    "quantization": {"group_size": 64, "bits": 4},
}


def write_safetensors(path: Path, tensors: dict[str, list[int]]) -> None:
    """A valid safetensors file of float32 zeros: header length, JSON header, data."""
    header: dict[str, object] = {}
    offset = 0
    for name, shape in tensors.items():
        size = 4 * math.prod(shape)
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + bytes(offset))


def make_model(root: Path, config: dict[str, object] = CONFIG) -> Path:
    root.mkdir(parents=True)
    (root / "config.json").write_text(json.dumps(config))
    (root / "tokenizer.json").write_text('{"model": {"vocab": {}}}')
    write_safetensors(root / "model-00001-of-00002.safetensors", {"a.weight": [4, 8]})
    write_safetensors(
        root / "model-00002-of-00002.safetensors", {"b.weight": [8, 8], "c.bias": [8]}
    )
    return root


def big_model(root: Path) -> Path:
    make_model(root)
    (root / "pad.safetensors").write_bytes(bytes(range(256)) * 4096)  # 1 MiB
    return root
