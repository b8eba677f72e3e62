"""`status` and `down` when no orchestrator runs: the agents a crashed one left, reached
on their sockets (an attach that does not adopt: their orphan grace keeps counting)."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time

from contract.agent_protocol import RankList
from node_agent.channel.unix_socket import socket_path
from orchestrator.config import ClusterSpec, NodeSpec
from orchestrator.transports import TransportError, transport_for
from orchestrator.transports.base import AgentOptions
from orchestrator.transports.pool import NodePool


async def _peek(spec: ClusterSpec, node: NodeSpec) -> RankList | str:
    """The node's orphaned agent's ranks, or why there are none to show."""
    # Only a look: an agent of another version is reported, never told to end its gang.
    options = AgentOptions(None, None, spec.supervisor.orphan_grace_s, 15.0,
                           secrets.token_hex(8), end_other_versions=False)
    socket = socket_path(spec.cluster.state_dir, spec.cluster.name, node.name)
    try:
        async with transport_for(node) as transport:
            handle = await transport.attach_agent(socket, options)
            if handle is None:
                return "no agent"
            async with handle:
                return await handle.launch_state()
    except (TransportError, OSError, TimeoutError) as exc:
        return f"cannot tell ({exc})"


async def orphan_report(spec: ClusterSpec) -> str:
    """One line per node, after a headline naming the orphaned gang and its deadline."""
    states = await asyncio.gather(*(_peek(spec, node) for node in spec.nodes))
    lines, ranks, since = [], 0, None
    for node, state in zip(spec.nodes, states, strict=True):
        if isinstance(state, str):
            lines.append(f"  {node.name}: {state}")
            continue
        ranks += len(state.ranks)
        if state.orphaned_since:
            since = min(since or state.orphaned_since, state.orphaned_since)
        pids = ", ".join(f"rank {r.rank} pid {r.pid}" for r in state.ranks) or "no ranks"
        launch = state.launch.launch_id if state.launch else "?"
        lines.append(f"  {node.name}: {pids} (launch {launch})")
    head = f"{spec.cluster.name}: no orchestrator; "
    if not ranks:
        return head + "no ranks running\n" + "\n".join(lines)
    grace = spec.supervisor.orphan_grace_s
    when = time.strftime("%H:%M:%S", time.localtime(since)) if since else "?"
    left = f", ended in {max(since + grace - time.time(), 0):.0f} s" if since else ""
    head += f"gang of {ranks} ranks serving, orphaned since {when}{left} unless `up` adopts it"
    return head + "\n" + "\n".join(lines)


async def end_orphaned_gangs(pool: NodePool) -> int:
    """Stop every rank of the agents reached on their sockets (each agent's own children)."""
    ended = 0
    for node in pool.nodes.values():
        if node.agent is None or not node.agent.attached:
            continue
        with contextlib.suppress(TransportError):
            ended += len(await node.agent.stop(None, pool.spec.supervisor.stop_grace_s))
    return ended
