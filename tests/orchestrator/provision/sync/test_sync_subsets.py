"""What sync sends each node in pipeline mode, from a placement and the source's manifest."""

from __future__ import annotations

from contract.model_manifest import Manifest, ManifestFile
from contract.model_shards import WeightShard
from contract.placement import Placement, RankShare
from orchestrator.provision.sync.subsets import split_subsets

SHARDS = [
    WeightShard(path="s0.safetensors", layers=[], shared=True),
    WeightShard(path="s1.safetensors", layers=[0, 1]),
    WeightShard(path="s2.safetensors", layers=[2, 3]),
]
PLACEMENT = Placement(mode="pipeline", reason="", layer_count=4, ranks=[
    RankShare(rank=0, node="a", layers=(2, 4), weight_bytes=1, kv_bytes=1),
    RankShare(rank=1, node="b", layers=(0, 2), weight_bytes=1, kv_bytes=1),
])


def manifest(*paths: str) -> Manifest:
    return Manifest(files=[ManifestFile(path=p, size=10, sha256="x") for p in sorted(paths)])


def test_each_node_gets_its_layers_shards_and_the_shared_files() -> None:
    """a (layers 2-3): s2; b (layers 0-1): s1; both: s0, config, index."""
    whole = manifest("config.json", "model.safetensors.index.json", "s0.safetensors",
                     "s1.safetensors", "s2.safetensors")
    subsets = split_subsets(PLACEMENT, whole, SHARDS)
    paths = {node: [f.path for f in m.files] for node, m in subsets.manifests.items()}
    common = ["config.json", "model.safetensors.index.json", "s0.safetensors"]
    assert paths == {"a": [*common, "s2.safetensors"], "b": [*common, "s1.safetensors"]}
    assert subsets.layers == {"a": (2, 4), "b": (0, 2)} and not subsets.missing
    assert subsets.manifest("c", whole) is whole  # a node not placed: the whole model


def test_a_source_holding_one_stage_only_is_named_for_the_other() -> None:
    """A source that is itself a pipeline node lacks the other stage's shard."""
    partial = manifest("config.json", "model.safetensors.index.json", "s0.safetensors",
                       "s2.safetensors")
    assert split_subsets(PLACEMENT, partial, SHARDS).missing == {"b": ["s1.safetensors"]}
