"""The placement on the nodes that remain when some are away (a Mac asleep past
`[supervisor] node_wait_s`): the same rules as at `up`, on fewer nodes.

    cluster.toml's nodes less those away (rank order kept) ─▶ place() ─▶ tensor, pipeline
    re-split by memory, or a refusal with the numbers (the model does not fit them)

The result also says which remaining node lacks files its new share needs: with `[model]
sync` in pipeline mode a node holds only its own layers' shards, and a node given more
layers would fail to load them.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass

import msgspec

from contract.fingerprint import NodeFingerprint
from contract.placement import Placement
from orchestrator.config import ClusterSpec, NodeSpec
from orchestrator.placement.decide import Refusal, place
from orchestrator.preflight.model import model_preflight


@dataclass(frozen=True)
class Remaining:
    """The spec and placement of a gang on the nodes that remain."""

    spec: ClusterSpec
    placement: Placement | None  # None: the model could not be read (tensor, as at `up`)


@dataclass(frozen=True)
class NotPlaced:
    """Why the remaining nodes cannot serve the model. `lacking_files`: they could, once
    they hold the files their new shares need (waiting for the node may still help)."""

    reason: str
    lacking_files: bool = False


def without(spec: ClusterSpec, away: Collection[str]) -> ClusterSpec:
    """cluster.toml's spec less the nodes `away` and the cables to them; rank order kept
    (the first remaining node runs rank 0 and the API). cluster.toml's spec is unchanged."""
    kept = [i for i, node in enumerate(spec.nodes) if node.name not in away]
    # A jaccl mesh names each node's device towards every rank, by rank: drop the ranks gone.
    nodes = [_rdma_towards(spec.nodes[i], kept, len(spec.nodes)) for i in kept]
    links = [link for link in spec.links if not set(link.between) & set(away)]
    return msgspec.structs.replace(spec, nodes=nodes, links=links)


def _rdma_towards(node: NodeSpec, kept: list[int], ranks: int) -> NodeSpec:
    rdma = node.rdma
    if rdma is None or len(rdma) != ranks:
        return node
    return msgspec.structs.replace(node, rdma=[rdma[j] for j in kept])


def place_remaining(
    spec: ClusterSpec, prints: Mapping[str, NodeFingerprint], away: Collection[str]
) -> Remaining | NotPlaced:
    """The gang on every node of `spec` but those `away`, from the nodes' latest
    fingerprints (taken at `up`)."""
    fewer = without(spec, away)
    if not fewer.nodes:
        return NotPlaced("no node remains")
    if any(node.name not in prints for node in fewer.nodes):
        return NotPlaced("a remaining node's fingerprint is unknown")
    placement = place(fewer, prints)
    if isinstance(placement, Refusal):
        return NotPlaced(f"{placement.found} (fix: {placement.fix})")
    lacking = [f for f in model_preflight(fewer, prints, placement) if f.check == "model"]
    if lacking:
        found = "; ".join(f"{f.node} {f.found}" for f in lacking)
        return NotPlaced(f"{found} (fix: {lacking[0].fix})", lacking_files=True)
    return Remaining(fewer, placement)
