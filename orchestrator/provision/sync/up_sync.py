"""`up` with `[model] sync = true`: the models synced before preflight, each (model, node)
once.

    instances launched afresh (not adopted) ─▶ grouped by model (instances.group_instances)
      each group: one sync_model over the nodes of its instances, their connections joined
      ─▶ each instance: ok when its own nodes hold their files, with its own pipeline split

Two instances of one model on a shared node (replicas, or a big gang and a small one) are
one group: the node is synced once for both, never twice at once into the same directory
(two stagings of one `<path>.partial-sync` would take each other's files away), as the
`sync` command does (command.py).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from contract.placement import Placement
from orchestrator.config import ClusterSpec
from orchestrator.provision.sync.command import render
from orchestrator.provision.sync.instances import ModelGroup, group_instances
from orchestrator.provision.sync.model_sync import SyncError, SyncReport, sync_model
from orchestrator.provision.sync.progress import LogProgress
from orchestrator.transports.pool import NodePool

log = logging.getLogger("orchestrator.sync")


@dataclass
class UpSync:
    """What `up` with model.sync learns from the sync, for one instance."""

    ok: bool  # every node of the instance holds its files (else reported: do not launch)
    # The pipeline split the nodes' shards were chosen for: `up` launches with this one
    # rather than deciding again (memory read moments later could move a boundary layer
    # onto a node that was not sent its shard).
    placement: Placement | None = None


async def sync_for_up(
    spec: ClusterSpec,
    fresh: Mapping[str, tuple[ClusterSpec, NodePool]],
    pools: Iterable[NodePool],
    config: Path,
) -> dict[str, UpSync]:
    """Sync the models of `fresh` (instance name: its spec and connected pool; "" for a
    file without [[instances]]) over the connections of `pools` (every instance's).
    Each model once, one after the other, as `sync` does."""
    pool = joined(spec, pools)
    outcome: dict[str, UpSync] = {}
    for group in group_instances(spec, {name: one for name, (one, _) in fresh.items()}):
        report = await _sync_group(group, pool, config)
        placements = (report.placements if report and report.placements
                      else [report.placement if report else None] * len(group.parts))
        for name, part, placement in zip(group.instances, group.parts, placements, strict=True):
            outcome[name] = UpSync(ok=report is not None and _ok_on(report, part),
                                   placement=placement)
    return outcome


def joined(spec: ClusterSpec, pools: Iterable[NodePool]) -> NodePool:
    """One pool over the instances' connections (a node shared by two instances: the first
    one's agent; the sync's files are the node's, whichever agent writes them). Not to be
    closed: each instance closes its own."""
    pool = NodePool(spec, on_event=lambda node, event: None, on_lost=lambda node, info: None)
    pool.nodes = {}
    for one in pools:
        for name, node in one.nodes.items():
            if node.connected:
                pool.nodes.setdefault(name, node)
    return pool


async def _sync_group(group: ModelGroup, pool: NodePool, config: Path) -> SyncReport | None:
    """One model to its instances' nodes, logged; None when it could not start."""
    named = f"[{', '.join(group.instances)}] " if any(group.instances) else ""
    if named:
        log.info("%ssyncing %s to %s", named, group.spec.model.path, ", ".join(group.nodes))
    try:
        report = await sync_model(group.spec, pool, LogProgress(), group.spec.model.sync_from,
                                  f"orchestrator sync {config}", group.parts)
    except SyncError as exc:
        log.error("%smodel sync failed, nothing was launched: %s", named, exc)
        return None
    for line in render(report).splitlines():
        (log.info if report.ok else log.error)("%s%s", named, line)
    return report


def _ok_on(report: SyncReport, part: ClusterSpec) -> bool:
    """Every node of `part` holds its files (another instance's failed node is not its)."""
    mine = {node.name for node in part.nodes}
    return all(n.status != "failed" for n in report.nodes if n.node in mine)
