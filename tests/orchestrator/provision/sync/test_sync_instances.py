"""`sync` with `[[instances]]`: which node gets which model, and a node in two pipeline
instances of one model gets both instances' shards."""

from __future__ import annotations

from pathlib import Path

from contract.model_manifest import Manifest, ManifestFile
from contract.placement import Placement
from orchestrator.config import check_cluster_file
from orchestrator.provision.sync.instances import model_groups, models_by_node
from orchestrator.provision.sync.subsets import Subsets, merge_subsets
from testkit.config_files import write

NODES = """
[[nodes]]
name = "a"
ip = "127.0.0.1"
[[nodes]]
name = "b"
ip = "127.0.0.1"
[[nodes]]
name = "c"
ip = "127.0.0.1"
[[links]]
between = ["a", "b"]
ips = ["10.0.0.1", "10.0.0.2"]
[[links]]
between = ["b", "c"]
ips = ["10.0.1.1", "10.0.1.2"]
[[links]]
between = ["c", "a"]
ips = ["10.0.2.1", "10.0.2.2"]
"""

INSTANCES = NODES + """
[[instances]]
name = "main"
model = "/models/big"
nodes = ["a", "b"]
[[instances]]
name = "fast"
model = "/models/small"
nodes = ["b"]
[[instances]]
name = "main-2"
model = "/models/big"
id = "big"
nodes = ["c"]
"""


def test_each_model_goes_to_its_instances_nodes_only(tmp_path: Path) -> None:
    """big to a, b and c (main and its replica), small to b alone; one group per model."""
    spec, _ = check_cluster_file(write(tmp_path, INSTANCES))
    groups = model_groups(spec)
    assert [(g.spec.model.path, g.nodes, g.instances) for g in groups] == [
        ("/models/big", ["a", "b", "c"], ["main", "main-2"]),
        ("/models/small", ["b"], ["fast"]),
    ]
    assert [[n.name for n in part.nodes] for part in groups[0].parts] == [["a", "b"], ["c"]]
    assert [len(g.spec.links) for g in groups] == [3, 0]  # a cable only where both ends are
    assert [len(part.links) for part in groups[0].parts] == [1, 0]
    assert models_by_node(spec) == {"a": ["/models/big"], "b": ["/models/big", "/models/small"],
                                    "c": ["/models/big"]}


def test_a_file_without_instances_is_one_group_of_every_node(tmp_path: Path) -> None:
    """The old file: the spec itself, every node, no instance names."""
    spec, _ = check_cluster_file(write(tmp_path, NODES + '[model]\npath = "/models/big"\n'))
    (group,) = model_groups(spec)
    assert group.spec is spec and group.parts == [spec] and group.instances == []


def files(*paths: str) -> Manifest:
    return Manifest(files=[ManifestFile(path=p, size=10, sha256="x") for p in paths])


SPLIT = Placement(mode="pipeline", reason="one", layer_count=12, ranks=[])
WHOLE = files("config.json", "s1.safetensors", "s2.safetensors", "s3.safetensors")


def test_a_node_in_two_pipeline_instances_gets_the_union_of_their_shards() -> None:
    """b holds layers of both instances: s1 (one) and s3 (other); a whole-model part wins."""
    one = Subsets(placement=SPLIT, manifests={"a": files("config.json", "s2.safetensors"),
                             "b": files("config.json", "s1.safetensors")},
                  layers={"a": (4, 8), "b": (0, 4)})
    other = Subsets(manifests={"b": files("config.json", "s3.safetensors"),
                               "c": files("config.json", "s1.safetensors")},
                    layers={"b": (8, 12), "c": (0, 8)}, missing={"b": ["s4.safetensors"]})
    merged = merge_subsets([(["a", "b"], one), (["b", "c"], other)], WHOLE)
    paths = {node: [f.path for f in m.files] for node, m in merged.manifests.items()}
    assert paths == {"a": ["config.json", "s2.safetensors"],
                     "b": ["config.json", "s1.safetensors", "s3.safetensors"],
                     "c": ["config.json", "s1.safetensors"]}
    assert merged.layers == {"a": (4, 8), "c": (0, 8)}  # b's two ranges are not one
    assert merged.missing == {"b": ["s4.safetensors"]}
    assert merged.placements == [SPLIT, None]  # each instance's own split, for `up`
    assert merge_subsets([(["a", "b"], one)], WHOLE).placements == [SPLIT]
    whole_on_b = merge_subsets([(["a", "b"], one), (["b"], Subsets())], WHOLE)
    assert whole_on_b.manifest("b", WHOLE) is WHOLE and "a" in whole_on_b.manifests
