"""A model directory with its weights split into several safetensors shards, as the hub's
large models come: one shard with the weights outside the layers (embeddings, final norm,
head), then `layers_per_shard` layers per shard, and a model.safetensors.index.json
naming each tensor's shard. The bundled and tiny models are one file; pipeline tests of
"each node gets only its layers' shards" need this layout."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

from contract.model_shards import INDEX_FILE

_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")


def shard_name(i: int, count: int) -> str:
    return f"model-{i:05d}-of-{count:05d}.safetensors"


def write_sharded_copy(source: Path, dest: Path, layers_per_shard: int) -> list[str]:
    """Copy source (an mlx-lm directory) to dest with its weights re-split; returns the
    shard names, the shared one first (shard k >= 2 holds layers
    [(k-2) * layers_per_shard, (k-1) * layers_per_shard))."""
    import mlx.core as mx

    dest.mkdir(parents=True, exist_ok=True)
    weights: dict[str, mx.array] = {}
    for path in sorted(source.iterdir()):
        if path.name.endswith(".safetensors"):
            weights.update(mx.load(str(path)))  # type: ignore[arg-type]
        elif path.is_file() and path.name != INDEX_FILE:
            shutil.copyfile(path, dest / path.name)
    groups: dict[int, dict[str, mx.array]] = {}
    for name, array in weights.items():
        found = _LAYER.search(name)
        group = 0 if found is None else 1 + int(found.group(1)) // layers_per_shard
        groups.setdefault(group, {})[name] = array
    count = len(groups)
    names = [shard_name(i + 1, count) for i in range(count)]
    weight_map: dict[str, str] = {}
    for i, group in enumerate(sorted(groups)):
        mx.save_safetensors(str(dest / names[i]), groups[group], metadata={"format": "mlx"})
        weight_map |= dict.fromkeys(groups[group], names[i])
    index = {
        "metadata": {"total_size": sum(a.nbytes for a in weights.values())},
        "weight_map": dict(sorted(weight_map.items())),
    }
    (dest / INDEX_FILE).write_text(json.dumps(index, indent=2))
    return names
