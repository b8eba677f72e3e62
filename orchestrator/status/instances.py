"""`/status` with `[[instances]]`: each instance's own status, and the cluster's as a whole
(ready while any instance is; nodes, ranks, serving figures and failures of them all)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import msgspec

from contract.placement import Placement
from orchestrator.config import ClusterSpec
from orchestrator.status.links import cluster_links
from orchestrator.status.model import ClusterStatus, InstanceStatus, NodeStatus, ServingStatus
from orchestrator.status.report import build_status
from orchestrator.supervision.supervisor import Supervisor
from orchestrator.transports.pool import NodePool


class RunningInstance(Protocol):
    name: str
    spec: ClusterSpec
    placement: Placement | None
    pool: NodePool
    supervisor: Supervisor


def build_instances_status(
    spec: ClusterSpec, instances: Sequence[RunningInstance]
) -> ClusterStatus:
    each = [
        (i, build_status(i.spec, i.pool.nodes.values(), i.supervisor.view.snapshot(),
                         i.placement))
        for i in instances
    ]
    parts = [_instance(i, status) for i, status in each]
    ready = [part for part in parts if part.state == "ready"]
    others = [part for part in parts if part.state != "ready"]
    nodes: dict[str, NodeStatus] = {}
    for _, status in each:
        for node in status.nodes:
            nodes.setdefault(node.name, node)
    first = each[0][1]
    return ClusterStatus(
        cluster=spec.cluster.name,
        state="ready" if ready else parts[0].state,
        reason="; ".join(f"{p.name}: {p.state}" + (f" ({p.reason})" if p.reason else "")
                         for p in others),
        api_url=first.api_url,
        model=", ".join(dict.fromkeys(part.model for part in parts)),
        backend=spec.cluster.backend,
        restarts=sum(part.restarts for part in parts),
        last_cause=next((p.last_cause for p in parts if p.last_cause), ""),
        orchestrator_pid=first.orchestrator_pid,
        nodes=list(nodes.values()),
        ranks=[rank for part in parts for rank in part.ranks],
        serving=_sum([part.serving for part in parts]),
        history=sorted((h for _, s in each for h in s.history), key=lambda h: h.at),
        links=cluster_links(spec),
        instances=parts,
    )


def _instance(instance: RunningInstance, status: ClusterStatus) -> InstanceStatus:
    ranks = [msgspec.structs.replace(rank, instance=instance.name) for rank in status.ranks]
    return InstanceStatus(
        name=instance.name,
        model=status.model,
        aliases=list(instance.spec.model.aliases),
        nodes=[node.name for node in instance.spec.nodes],
        mode=instance.placement.mode if instance.placement else "",
        state=status.state,
        reason=status.reason,
        launch_id=status.launch_id,
        restarts=status.restarts,
        last_cause=status.last_cause,
        ranks=ranks,
        serving=status.serving,
    )


def _sum(parts: list[ServingStatus]) -> ServingStatus:
    return ServingStatus(
        requests_running=sum(p.requests_running for p in parts),
        requests_waiting=sum(p.requests_waiting for p in parts),
        generation_tokens_total=sum(p.generation_tokens_total for p in parts),
        tokens_per_second=sum(p.tokens_per_second for p in parts),
        draft_tokens_total=sum(p.draft_tokens_total for p in parts),
        accepted_tokens_total=sum(p.accepted_tokens_total for p in parts),
    )
