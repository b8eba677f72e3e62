"""Builds the `/status` answer from the supervisor's snapshot and the nodes' fingerprints."""

from __future__ import annotations

import os
import time
from collections.abc import Iterable

from contract.exit_codes import describe_exit
from contract.fingerprint import NodeFingerprint
from contract.placement import Placement
from orchestrator.config import ClusterSpec
from orchestrator.launch.gang import LaunchedRank
from orchestrator.status.links import cluster_links
from orchestrator.status.model import (
    ClusterStatus,
    LayerRange,
    NodeStatus,
    RankStatus,
    RestartEntry,
    ServingStatus,
)
from orchestrator.supervision.failures import RankFailure
from orchestrator.supervision.snapshot import SupervisorSnapshot
from orchestrator.transports.pool import NodeConnection


def build_status(
    spec: ClusterSpec,
    nodes: Iterable[NodeConnection],
    snapshot: SupervisorSnapshot,
    placement: Placement | None = None,
) -> ClusterStatus:
    failure = snapshot.last_failure
    return ClusterStatus(
        cluster=spec.cluster.name,
        state=snapshot.state.value,
        reason=snapshot.reason,
        api_url=f"http://{spec.api.host}:{spec.api.port}/v1",
        model=spec.model.served_id,
        backend=spec.cluster.backend,
        launch_id=snapshot.launch_id,
        restarts=snapshot.restarts,
        last_cause=failure.summary() if failure else "",
        orchestrator_pid=os.getpid(),
        nodes=[_node(connection, _layers(placement, connection.spec.name)) for connection in nodes],
        ranks=[_rank(process) for process in snapshot.ranks],
        serving=_serving(snapshot),
        history=[_restart(result.root) for result in snapshot.history],
        placement=placement,
        links=cluster_links(spec),
    )


def _restart(failure: RankFailure) -> RestartEntry:
    wall = time.time() - (time.monotonic() - failure.at)  # `at` is on the monotonic clock
    return RestartEntry(at=wall, cause=failure.cause.value, summary=failure.summary())


def _layers(placement: Placement | None, node: str) -> LayerRange | None:
    """The node's layers in pipeline mode (None in tensor mode)."""
    for share in placement.ranks if placement else []:
        if share.node == node and share.layers:
            return LayerRange(start=share.layers[0], end=share.layers[1])
    return None


def _node(connection: NodeConnection, layers: LayerRange | None) -> NodeStatus:
    spec = connection.spec
    status = NodeStatus(
        name=spec.name,
        transport=spec.transport,
        host=spec.ssh or "localhost",
        connected=connection.connected,
        layers=layers,
    )
    if connection.fingerprint is not None:
        _fill_from_fingerprint(status, connection.fingerprint)
    _fill_from_usage(status, connection)
    return status


def _fill_from_usage(status: NodeStatus, connection: NodeConnection) -> None:
    """Live figures from the agent's latest report; none (and stale) once it is too old."""
    if connection.usage is None:
        return
    status.usage_age_s = time.monotonic() - connection.usage_at
    usage = connection.fresh_usage()
    status.usage_stale = usage is None
    if usage is None:
        return
    status.memory_total_bytes = usage.memory.total_bytes
    status.memory_available_bytes = usage.memory.available_bytes or 0
    status.memory_ranks_bytes = sum(rank.rss_bytes for rank in usage.ranks)
    status.load_1m = usage.load_1m


def _fill_from_fingerprint(status: NodeStatus, fingerprint: NodeFingerprint) -> None:
    status.hostname = fingerprint.hostname
    status.chip = fingerprint.chip or ""
    status.os = f"{fingerprint.os.name} {fingerprint.os.version}"
    status.mlx_version = fingerprint.packages.get("mlx") or ""
    status.mlx_lm_version = fingerprint.packages.get("mlx-lm") or ""
    status.blas = fingerprint.blas
    rdma = fingerprint.rdma
    if rdma is not None:
        active = sum(1 for device in rdma.devices if device.active)
        status.rdma = (
            f"{rdma.status}, {active}/{len(rdma.devices)} active" if rdma.devices else rdma.status
        )


def _rank(process: LaunchedRank) -> RankStatus:
    exited = process.exited
    if exited is None:
        state = "running" if process.pid else "starting"
        last_exit = ""
    else:
        state = "stopped" if exited.stopped else "exited"
        last_exit = exited.signal or (
            describe_exit(exited.returncode) if exited.returncode is not None else ""
        )
    uptime = time.time() - process.started_at if process.running else 0.0
    return RankStatus(
        rank=process.rank,
        node=process.node,
        pid=process.pid,
        state=state,
        uptime_s=uptime,
        last_exit=last_exit,
    )


def _serving(snapshot: SupervisorSnapshot) -> ServingStatus:
    sample = snapshot.serving
    if sample is None:
        return ServingStatus()
    return ServingStatus(
        requests_running=int(sample.running),
        requests_waiting=int(sample.waiting),
        generation_tokens_total=int(sample.generation_tokens),
        tokens_per_second=snapshot.tokens_per_second,
        ttft_p50_s=sample.ttft_p50_s,
        draft_tokens_total=int(sample.draft_tokens),
        accepted_tokens_total=int(sample.accepted_tokens),
    )
