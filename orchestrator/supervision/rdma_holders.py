"""After a JACCL EBUSY: who holds the nodes' RDMA devices, and which of them are ours to end.

A Thunderbolt RDMA device runs out of queue pairs (about ten) and memory regions (about a
hundred) while their holders live, so backing off cannot clear an EBUSY (ml-explore/mlx
#3162, #4209). The agents list the holders (node_agent/rdma_holders.py); the supervisor ends
those that carry one of our launch ids, retries once, and otherwise fails naming them.
A process that is not ours is never ended.
"""

from __future__ import annotations

import asyncio
import logging

from contract.agent_protocol import RdmaHolder
from orchestrator.supervision.interfaces import Holders
from orchestrator.transports import AgentRequestError, TransportError
from orchestrator.transports.pool import NodePool

log = logging.getLogger(__name__)

RUNBOOK = "docs/operations.md, `ebusy`"
REAP_GRACE_S = 5.0


class AgentHolders:
    """The holders, found and ended through the nodes' agents (a fake in unit tests)."""

    def __init__(self, pool: NodePool) -> None:
        self.pool = pool

    async def find(self, nodes: list[str]) -> dict[str, list[RdmaHolder]]:
        """Each node's holders; a node whose agent cannot answer is left out (logged)."""

        async def one(name: str) -> list[RdmaHolder]:
            try:
                return await self.pool.agent(name).rdma_holders()
            except (TransportError, AgentRequestError, TimeoutError) as exc:
                log.warning("[%s] cannot list the RDMA devices' holders: %s", name, exc)
                return []

        found = await asyncio.gather(*(one(name) for name in nodes))
        return {name: holders for name, holders in zip(nodes, found, strict=True) if holders}

    async def end(self, node: str, holder: RdmaHolder) -> bool:
        """End one of our holders by PID; the agent checks its launch id first."""
        try:
            return await self.pool.agent(node).reap(holder.pid, holder.launch_id, REAP_GRACE_S)
        except (TransportError, AgentRequestError, TimeoutError) as exc:
            log.warning("[%s] cannot end pid %d: %s", node, holder.pid, exc)
            return False


def describe(node: str, holder: RdmaHolder) -> str:
    """`pid 4242 on b: python -m mlx_lm.server ... (JACCL env, launch L1)`."""
    what = []
    if holder.files:
        what.append("has " + ", ".join(holder.files) + " open")
    if holder.jaccl_env:
        what.append("JACCL env")
    if holder.launch_id:
        what.append(f"launch {holder.launch_id}")
    command = holder.command if len(holder.command) <= 80 else holder.command[:77] + "..."
    return f"pid {holder.pid} on {node}: {command} ({', '.join(what)})"


def split_ours(
    found: dict[str, list[RdmaHolder]], our_launches: set[str]
) -> tuple[list[tuple[str, RdmaHolder]], list[tuple[str, RdmaHolder]]]:
    """(ours, others): ours carry one of our launch ids in their env."""
    ours: list[tuple[str, RdmaHolder]] = []
    others: list[tuple[str, RdmaHolder]] = []
    for node, holders in found.items():
        for holder in holders:
            mine = holder.launch_id and holder.launch_id in our_launches
            (ours if mine else others).append((node, holder))
    return ours, others


async def end_our_holders(
    holders: Holders, nodes: list[str], our_launches: set[str], summary: str, retry: bool
) -> str | None:
    """Find the holders on every node and end ours; the reason to fail with when others
    hold the devices (never ended) or no retry is left, else None (retry)."""
    ours, others = split_ours(await holders.find(nodes), our_launches)
    for node, holder in ours:
        ended = await holders.end(node, holder)
        log.warning("ebusy: %s %s", "ended" if ended else "could not end", describe(node, holder))
    if not others:
        return None if retry else failed_reason(summary)
    named = "; ".join(describe(node, holder) for node, holder in others)
    return (
        f"{summary}; the RDMA devices are held by programs that are not this cluster's "
        f"(not ended): {named}. End them, then `orchestrator restart` ({RUNBOOK})"
    )


def failed_reason(summary: str) -> str:
    """Why EBUSY failed the cluster when nothing but our own (now ended) ranks held it."""
    return (
        f"{summary}; EBUSY again after one retry, and no other process holds the RDMA "
        f"devices: reboot the node (its device names may change: check `ibv_devices` "
        f"against the node's rdma list), then `orchestrator restart` ({RUNBOOK})"
    )
