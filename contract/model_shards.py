"""Which of a model's files a rank needs: in pipeline mode only the safetensors shards
holding its layers, as mlx-lm's `sharded_load` decides it.

    model.safetensors.index.json  weight_map: tensor name ─▶ shard file
        "model.layers.12.mlp.up_proj.weight" ─▶ layer 12's shard
        any name without `layers.N.` (embeddings, final norm, head) ─▶ every stage needs it

Every other file (config, tokenizer, the index itself, a weights file the index does not
name) is needed by every rank. Tensor mode and one rank need every file. `orchestrator
sync` sends each node only its files and preflight checks only those, both from here.
"""

from __future__ import annotations

import json
import re

from msgspec import Struct

from contract.placement import Placement

INDEX_FILE = "model.safetensors.index.json"
_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")


class WeightShard(Struct, frozen=True, kw_only=True):
    path: str  # relative to the model directory, as the index names it
    layers: list[int]  # the decoder layers it holds weights of, sorted
    shared: bool = False  # holds weights outside every layer: each stage loads it


class ShardIndexError(ValueError):
    """The index cannot be read as mlx-lm's (message names the field)."""


def parse_index(text: str | bytes) -> list[WeightShard]:
    """The shards an index names, with their layers; ShardIndexError when it is malformed."""
    try:
        weight_map = json.loads(text)["weight_map"]
    except (ValueError, KeyError, TypeError) as exc:
        raise ShardIndexError(f"{INDEX_FILE} has no readable weight_map ({exc})") from None
    if not isinstance(weight_map, dict):
        raise ShardIndexError(f"{INDEX_FILE}: weight_map is not an object")
    layers: dict[str, set[int]] = {}
    shared: set[str] = set()
    for name, shard in weight_map.items():
        if not isinstance(shard, str):
            raise ShardIndexError(f"{INDEX_FILE}: weight_map[{name!r}] is not a file name")
        layers.setdefault(shard, set())
        found = _LAYER.search(name)
        if found is None:
            shared.add(shard)
        else:
            layers[shard].add(int(found.group(1)))
    return [
        WeightShard(path=path, layers=sorted(held), shared=path in shared)
        for path, held in sorted(layers.items())
    ]


def needed_files(
    files: list[str], shards: list[WeightShard], layers: tuple[int, int] | None
) -> list[str]:
    """Of `files`, those a rank running layers [start, end) needs (None: every file)."""
    if layers is None:
        return sorted(files)
    start, end = layers
    by_path = {shard.path: shard for shard in shards}

    def needed(path: str) -> bool:
        shard = by_path.get(path)
        return shard is None or shard.shared or any(start <= n < end for n in shard.layers)

    return sorted(path for path in files if needed(path))


def index_total_size(text: str | bytes) -> int | None:
    """The index's metadata.total_size (the weights' bytes), when it states one."""
    try:
        total = json.loads(text).get("metadata", {}).get("total_size")
    except (ValueError, AttributeError):
        return None
    return int(total) if isinstance(total, int | float) and total > 0 else None


def stage_layers(placement: object, node: str) -> tuple[int, int] | None:
    """The node's layers in a pipeline placement; None in tensor mode (every file)."""
    if not isinstance(placement, Placement) or placement.mode != "pipeline":
        return None
    return next((share.layers for share in placement.ranks if share.node == node), None)
