"""What is done and checked before each launch of a gang: its nodes connected, the ranks
a lost node left behind ended, the RDMA device names read again, the links answering.

A failure found here is the launch's failure (the loop recovers from it as from any);
nothing here spends a restart or waits for a node (waits.py does, for the links).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from orchestrator.config import ClusterSpec
from orchestrator.launch.stale_ranks import end_stale_ranks
from orchestrator.state_file import RankRecord
from orchestrator.supervision.failures import Cause, RankFailure
from orchestrator.supervision.metrics import OrchestratorMetrics
from orchestrator.supervision.rdma_devices import rdma_device_problems
from orchestrator.transports.pool import NodePool


async def before_launch(
    spec: ClusterSpec,
    pool: NodePool,
    metrics: OrchestratorMetrics,
    stale: list[RankRecord],
    adopting: bool,
    links: Callable[[], Awaitable[list[RankFailure] | None]] | None,
    clock: Callable[[], float],
) -> list[RankFailure] | None:
    """None: launch the gang of `spec` now; else its failures ([] when `links` saw a stop
    request). `stale`: ranks to reap by PID first (their stop was never confirmed);
    `adopting`: the next is a running gang (it holds its ports and devices already);
    `links`: Waits.links, None to skip them."""
    errors = await pool.connect_all([node.name for node in spec.nodes])
    for name, node in pool.nodes.items():
        metrics.node_up.labels(node=name).set(1 if node.connected else 0)
    if errors:
        return [RankFailure(Cause.AGENT_LOST, e.node, None, e.message, clock()) for e in errors]
    if stale:
        await end_stale_ranks(pool, stale)
    if adopting:
        return None
    devices = await rdma_device_problems(spec, pool, clock())
    if devices:
        return devices
    lost = await links() if links is not None else []
    return None if lost == [] else lost or []  # nodes lost meanwhile; [] on a stop request
