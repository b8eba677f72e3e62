"""Ends the ranks a crashed orchestrator left behind, as recorded in its state file.

Each rank is ended by PID through its node's agent, which first checks that the process
still carries the recorded launch id in its environment: a reused PID is never killed.
"""

from __future__ import annotations

import logging

from orchestrator.state_file import RankRecord
from orchestrator.transports import AgentRequestError, TransportError
from orchestrator.transports.pool import NodePool

log = logging.getLogger(__name__)


async def end_stale_ranks(pool: NodePool, records: list[RankRecord], grace_s: float = 5.0) -> int:
    """Returns how many recorded ranks were still running and have been ended."""
    ended = 0
    for record in records:
        if record.node not in pool.nodes:
            continue
        try:
            killed = await pool.agent(record.node).reap(record.pid, record.launch_id, grace_s)
        except (TransportError, AgentRequestError) as exc:
            log.warning(
                "could not check rank %d (pid %d) on %s: %s",
                record.rank,
                record.pid,
                record.node,
                exc,
            )
            continue
        if killed:
            ended += 1
            log.info(
                "ended rank %d (pid %d, launch %s) left on %s by a previous run",
                record.rank,
                record.pid,
                record.launch_id,
                record.node,
            )
    return ended
