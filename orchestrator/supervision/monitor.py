"""Turns what the agents report (rank exits, a lost agent, a silent link) into failures of
the current gang.

The agents' callbacks land here; the supervision loop waits on `failed` and, once the gang
is stopped, takes every failure collected meanwhile to pick the root cause.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping

from contract.agent_protocol import Event, Exited, LinkState, Log
from orchestrator.config.links import Hop
from orchestrator.launch.gang import Gang
from orchestrator.supervision.failures import Cause, RankFailure, classify_exit
from orchestrator.supervision.metrics import OrchestratorMetrics
from orchestrator.transports import AgentExit
from orchestrator.transports.pool import NodeConnection

log = logging.getLogger(__name__)
rank_log = logging.getLogger("rank")
LOW_MEMORY_SHARE = 0.05  # a SIGKILL below this share of free memory is taken for the OOM killer


class GangMonitor:
    def __init__(
        self,
        nodes: Mapping[str, NodeConnection],
        metrics: OrchestratorMetrics,
        clock: Callable[[], float],
        hops: list[Hop] | None = None,
    ) -> None:
        self._nodes, self._metrics, self._clock = nodes, metrics, clock
        self._names = list(nodes)  # rank order
        self._hops = hops or []
        self.gang: Gang | None = None
        self._failures: list[RankFailure] = []
        self.failed = asyncio.Event()

    def watch(self, gang: Gang) -> None:
        """From now on, failures are this gang's; earlier reports are forgotten."""
        self.gang = gang
        self.take()

    def report(self, failure: RankFailure) -> None:
        log.warning("failure: %s", failure.summary())
        self._failures.append(failure)
        self.failed.set()

    def take(self) -> list[RankFailure]:
        """Every failure reported since the last take, in arrival order."""
        taken, self._failures = self._failures, []
        self.failed.clear()
        return taken

    # ── callbacks of the node pool ──

    def on_agent_event(self, node: str, event: Event) -> None:
        if isinstance(event, Log):
            rank_log.info("[%s r%d] %s", node, event.rank, event.line)
        elif isinstance(event, Exited):
            self._on_exit(node, event)
        elif isinstance(event, LinkState) and not event.up and self.gang is not None:
            self._on_link_down(node, event)

    def on_agent_lost(self, node: str, exit_info: AgentExit) -> None:
        self._metrics.node_up.labels(node=node).set(0)
        gang = self.gang
        if gang is not None and any(p.node == node and p.running for p in gang.ranks.values()):
            self.report(RankFailure(Cause.AGENT_LOST, node, None, exit_info.reason, self._clock()))

    def _on_exit(self, node: str, exited: Exited) -> None:
        if self.gang is None or self.gang.note_exit(exited) is None:
            return  # another launch's rank, or a standby
        self._metrics.rank_up.labels(rank=str(exited.rank)).set(0)
        if not exited.stopped:
            pressure = self._low_memory(node)
            self.report(classify_exit(exited, node, self._clock(), memory_pressure=pressure))

    def _on_link_down(self, node: str, state: LinkState) -> None:
        rank, peer = None, f"{state.host}:{state.port}"
        for hop in self._hops:
            if self._names[hop.src] == node and (hop.address.ip, hop.port) == (
                state.host,
                state.port,
            ):
                rank, peer = hop.src, f"{self._names[hop.dst]} at {peer} ({hop.address.field})"
        detail = f"link to {peer} stopped answering: {state.error}"
        self.report(RankFailure(Cause.LINK_DOWN, node, rank, detail, self._clock()))

    def _low_memory(self, node: str) -> bool:
        """From the node's live usage report; the fingerprint taken at `up` if none."""
        connection = self._nodes[node]
        usage, fingerprint = connection.fresh_usage(), connection.fingerprint
        memory = usage.memory if usage else fingerprint.memory if fingerprint else None
        return bool(
            memory
            and memory.available_bytes is not None
            and memory.available_bytes < LOW_MEMORY_SHARE * memory.total_bytes
        )
