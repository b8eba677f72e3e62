"""What each node is sent: in pipeline mode only the files its rank loads.

    source's config.json + model.safetensors.index.json  ─┐
    every node's memory (a fingerprint without the model) ─┴▶ place() ─▶ each rank's layers
    each node: contract/model_shards.needed_files(its layers) ─▶ its own Manifest

The placement is the one `up` decides at preflight from the same inputs (the source's
config stands in for rank 0's copy, which may not exist yet), so preflight then finds
every node holding what its rank needs. Tensor mode, one node, a model without an index,
or a node that cannot be placed: every node gets the whole model.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
from dataclasses import dataclass, field

import msgspec

from contract.fingerprint import ModelInfo, NodeFingerprint
from contract.model_config import config_info
from contract.model_manifest import Manifest
from contract.model_shards import (
    INDEX_FILE,
    ShardIndexError,
    WeightShard,
    index_total_size,
    needed_files,
    parse_index,
)
from contract.placement import Placement
from orchestrator.config import ClusterSpec
from orchestrator.placement.decide import place
from orchestrator.provision.sync.transfer import Source
from orchestrator.transports.errors import AgentRequestError, TransportError
from orchestrator.transports.pool import NodePool

log = logging.getLogger("orchestrator.sync")
FINGERPRINT_TIMEOUT_S = 120.0


@dataclass
class Subsets:
    placement: Placement | None = None  # pipeline only
    manifests: dict[str, Manifest] = field(default_factory=dict)  # node ─▶ its files
    layers: dict[str, tuple[int, int]] = field(default_factory=dict)
    missing: dict[str, list[str]] = field(default_factory=dict)  # needed, not at the source
    # Each instance's own pipeline split, in the order of merge_subsets' parts: `up`
    # launches each instance with the split its shards were chosen for (up_sync.py).
    placements: list[Placement | None] = field(default_factory=list)

    def manifest(self, node: str, whole: Manifest) -> Manifest:
        return self.manifests.get(node, whole)


async def node_subsets(
    spec: ClusterSpec, pool: NodePool, manifest: Manifest, source: Source
) -> Subsets:
    if spec.cluster.parallel == "tensor" or len(spec.nodes) == 1:
        return Subsets()
    sizes = {f.path: f.size for f in manifest.files}
    if INDEX_FILE not in sizes or "config.json" not in sizes:
        return Subsets()
    try:
        index = await source.read(INDEX_FILE, 0, sizes[INDEX_FILE])
        config = json.loads(await source.read("config.json", 0, sizes["config.json"]))
        info = config_info(config, f"config.json of {spec.model.path}")
        shards = parse_index(index)
    except (OSError, ValueError, ShardIndexError) as exc:
        log.warning("sending every node the whole model: cannot read the index or config: %s", exc)
        return Subsets()
    if sum(1 for shard in shards if not shard.shared) < 2:
        return Subsets()  # every stage would need every shard: no placement to ask for
    weights = index_total_size(index) or sum(
        size for path, size in sizes.items() if path.endswith(".safetensors")
    )
    model = ModelInfo(
        spec=spec.model.path, exists=True, kind="mlx_dir", weight_bytes=weights,
        config=info, shards=shards,
    )
    placement = await _place(spec, pool, model)
    if placement is None:
        return Subsets()
    return split_subsets(placement, manifest, shards)


async def _place(spec: ClusterSpec, pool: NodePool, model: ModelInfo) -> Placement | None:
    """The pipeline placement `up` would decide; None in tensor mode or when a node's
    memory is unknown (not connected)."""
    if any(name not in pool.nodes or not pool.nodes[name].connected for name in
           (node.name for node in spec.nodes)):
        return None
    try:
        found = await asyncio.gather(
            *(pool.agent(node.name).fingerprint(None, FINGERPRINT_TIMEOUT_S)
              for node in spec.nodes)
        )
    except (AgentRequestError, TransportError) as exc:
        log.warning("sending every node the whole model: %s", exc)
        return None
    prints: dict[str, NodeFingerprint] = {
        node.name: fingerprint for node, fingerprint in zip(spec.nodes, found, strict=True)
    }
    first = spec.nodes[0].name  # placement reads the model at rank 0
    prints[first] = msgspec.structs.replace(prints[first], model=model)
    try:
        decided = place(spec, prints)
    except Exception as exc:  # the whole model is always a correct answer
        log.warning("sending every node the whole model: no placement (%s)", exc)
        return None
    return decided if isinstance(decided, Placement) and decided.mode == "pipeline" else None


async def group_subsets(
    parts: list[ClusterSpec], pool: NodePool, manifest: Manifest, source: Source
) -> Subsets:
    """Each instance's subsets of one model (its own placement), merged per node."""
    found = [([node.name for node in part.nodes], await node_subsets(part, pool, manifest, source))
             for part in parts]
    return merge_subsets(found, manifest)


def merge_subsets(parts: list[tuple[list[str], Subsets]], whole: Manifest) -> Subsets:
    """A node in several instances of one model gets the union of their files (the whole
    model when one of them wants it whole); its layers are shown when one instance has it.
    Each part's own placement is kept, in order."""
    placements = [subsets.placement for _, subsets in parts]
    if len(parts) == 1:
        return dataclasses.replace(parts[0][1], placements=placements)
    merged = Subsets(placements=placements)
    for node in dict.fromkeys(name for names, _ in parts for name in names):
        mine = [subsets for names, subsets in parts if node in names]
        if any(node not in subsets.manifests for subsets in mine):
            continue  # the whole model
        wanted = {f.path for subsets in mine for f in subsets.manifests[node].files}
        merged.manifests[node] = Manifest(files=[f for f in whole.files if f.path in wanted])
        if len(mine) == 1 and node in mine[0].layers:
            merged.layers[node] = mine[0].layers[node]
        lacking = sorted({path for subsets in mine for path in subsets.missing.get(node, [])})
        if lacking:
            merged.missing[node] = lacking
    return merged


def split_subsets(placement: Placement, manifest: Manifest, shards: list[WeightShard]) -> Subsets:
    have = {f.path for f in manifest.files}
    every = sorted(have | {shard.path for shard in shards})
    subsets = Subsets(placement=placement)
    for share in placement.ranks:
        needed = needed_files(every, shards, share.layers)
        if share.layers is not None:
            subsets.layers[share.node] = share.layers
        wanted = set(needed)
        subsets.manifests[share.node] = Manifest(
            files=[f for f in manifest.files if f.path in wanted]
        )
        lacking = [path for path in needed if path not in have]
        if lacking:
            subsets.missing[share.node] = lacking
    return subsets
