"""Which node gets which model when the file has `[[instances]]`.

    [[instances]] ─▶ instance_specs() ─▶ grouped by model path ─▶ one ModelGroup per model
    each group: synced once, to the nodes of its instances only; in pipeline mode each
    node gets the shards of its own layers in every instance of that model it serves
    (subsets.merge_subsets), so replicas of one model on a shared node never take
    each other's files away.

A file without `[[instances]]` is one group: the file's spec, every node, as before.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import msgspec

from orchestrator.config import ClusterSpec
from orchestrator.config.instances import instance_specs


@dataclass(frozen=True)
class ModelGroup:
    spec: ClusterSpec  # the model over every node of its instances (the first one's settings)
    parts: list[ClusterSpec]  # each instance's own spec: its nodes, its pipeline split
    instances: list[str]  # their names ([] for a file without [[instances]])

    @property
    def nodes(self) -> list[str]:
        return [node.name for node in self.spec.nodes]


def model_groups(spec: ClusterSpec) -> list[ModelGroup]:
    """One group per distinct model path, in the order the instances first name them."""
    if not spec.instances:
        return [ModelGroup(spec, [spec], [])]
    return group_instances(spec, instance_specs(spec))


def group_instances(spec: ClusterSpec, derived: Mapping[str, ClusterSpec]) -> list[ModelGroup]:
    """`derived` (some of the file's instance specs, by name) grouped by model path: what
    `up` syncs, each (model, node) once, for the instances it launches afresh."""
    members: dict[str, list[tuple[str, ClusterSpec]]] = {}
    for name, one in derived.items():
        members.setdefault(one.model.path, []).append((name, one))
    groups = []
    for pairs in members.values():
        names = {node.name for _, part in pairs for node in part.nodes}
        merged = msgspec.structs.replace(
            pairs[0][1],
            nodes=[node for node in spec.nodes if node.name in names],
            links=[link for link in spec.links if set(link.between) <= names],
        )
        groups.append(ModelGroup(merged, [d for _, d in pairs], [n for n, _ in pairs]))
    return groups


def models_by_node(spec: ClusterSpec) -> dict[str, list[str]]:
    """Each node's model paths (what `sync` sends it); a node no instance names gets none."""
    held: dict[str, list[str]] = {node.name: [] for node in spec.nodes}
    for group in model_groups(spec):
        for name in group.nodes:
            held[name].append(group.spec.model.path)
    return held
