"""RDMA device names read again from each node before every JACCL launch.

A Mac's RDMA device names can change after a reboot (ml-explore/mlx#3207): a relaunch with
the names preflight saw at `up` would fail in JACCL's set-up, again and again. Each node's
fingerprint (model left out: only the system and its RDMA devices) is taken afresh and
preflight's JACCL check run on it; a device that is gone fails the cluster at once, naming
what the node has now, without spending a restart.
"""

from __future__ import annotations

import asyncio
import logging

from contract.fingerprint import NodeFingerprint
from orchestrator.config import ClusterSpec
from orchestrator.preflight.checks import run_preflight
from orchestrator.supervision.failures import Cause, RankFailure
from orchestrator.transports import AgentRequestError, TransportError
from orchestrator.transports.pool import NodePool

log = logging.getLogger(__name__)
FINGERPRINT_S = 60.0


async def rdma_device_problems(
    spec: ClusterSpec, pool: NodePool, now: float
) -> list[RankFailure]:
    """A spawn_failed failure per JACCL problem found now (none for ring), saying what is
    wrong and the fix. Nothing when a node cannot answer: its lost agent is reported."""
    if spec.cluster.backend != "jaccl":
        return []

    async def fresh(name: str) -> NodeFingerprint | None:
        try:
            return await pool.agent(name).fingerprint(None, FINGERPRINT_S)
        except (TransportError, AgentRequestError, TimeoutError) as exc:
            log.warning("[%s] RDMA devices not read again: %s", name, exc)
            return None

    names = list(pool.nodes)
    prints = dict(zip(names, await asyncio.gather(*(fresh(name) for name in names)), strict=True))
    answered = {name: fp for name, fp in prints.items() if fp is not None}
    if len(answered) < len(names):
        return []
    return [
        RankFailure(Cause.SPAWN_FAILED, f.node, None,
                    f"{f.found}, read again before this launch: {f.fix} (device names can "
                    "change after a reboot)", now)
        for f in run_preflight(spec, answered)
        if f.check == "jaccl"
    ]
