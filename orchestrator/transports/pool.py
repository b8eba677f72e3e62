"""Connections to every node's agent: connect all at once, report every failure after all tried.

As in dask's SSHCluster, starts run concurrently and errors are gathered only once each has
finished, so a failure on one node never leaves another half-connected.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass

from contract.agent_protocol import Event, NodeUsage
from contract.fingerprint import NodeFingerprint
from node_agent.channel.unix_socket import socket_path
from orchestrator.config import ClusterSpec, NodeSpec
from orchestrator.transports import (
    AgentExit,
    AgentHandle,
    ErrorKind,
    Transport,
    TransportError,
    transport_for,
)

log = logging.getLogger(__name__)

EventSink = Callable[[str, Event], None]
LostSink = Callable[[str, AgentExit], None]


USAGE_INTERVAL_S = 2.0  # how often each agent reports the node's usage
USAGE_STALE_S = 10.0  # a report older than this is shown as stale, not as the last number
# The first fingerprint hashes the whole model on the node (later ones hit its hash cache);
# a lost agent still fails the request at once, so this only bounds a slow disk.
FINGERPRINT_TIMEOUT_S = 3600.0


@dataclass
class NodeConnection:
    spec: NodeSpec
    transport: Transport | None = None
    agent: AgentHandle | None = None
    fingerprint: NodeFingerprint | None = None
    usage: NodeUsage | None = None  # the agent's latest report
    usage_at: float = 0.0  # time.monotonic() when it arrived

    @property
    def connected(self) -> bool:
        return self.agent is not None and not self.agent.closed

    def fresh_usage(self, now: float | None = None) -> NodeUsage | None:
        """The latest usage report, unless the agent has been silent past USAGE_STALE_S."""
        now = time.monotonic() if now is None else now
        return self.usage if self.usage and now - self.usage_at <= USAGE_STALE_S else None


class NodePool:
    def __init__(
        self,
        spec: ClusterSpec,
        on_event: EventSink,
        on_lost: LostSink,
        connect_timeout_s: float = 30.0,
        usage_interval_s: float | None = None,
    ) -> None:
        self.spec = spec
        self.nodes = {node.name: NodeConnection(node) for node in spec.nodes}
        self._on_event, self._on_lost = on_event, on_lost
        self._connect_timeout_s = connect_timeout_s
        self._usage_interval_s = usage_interval_s
        self._watchers: set[asyncio.Task[None]] = set()
        # Ours on every connection: reconnecting, we take over a session the agent still
        # holds for us (a node that slept); another orchestrator's is refused.
        self._orchestrator_id = secrets.token_hex(8)

    def agent(self, name: str) -> AgentHandle:
        agent = self.nodes[name].agent
        if agent is None or agent.closed:
            raise TransportError(name, ErrorKind.AGENT_LOST, "the node's agent is not connected")
        return agent

    async def connect_all(self, only: list[str] | None = None) -> list[TransportError]:
        """Connect every node (of `only`, when given) not connected yet; returns the
        failures, one per node."""
        names = [name for name, node in self.nodes.items()
                 if not node.connected and (only is None or name in only)]
        results = await asyncio.gather(
            *(self.connect(name) for name in names), return_exceptions=True
        )
        errors: list[TransportError] = []
        for name, result in zip(names, results, strict=True):
            if isinstance(result, TransportError):
                errors.append(result)
            elif isinstance(result, BaseException):
                errors.append(
                    TransportError(name, ErrorKind.OTHER, f"{type(result).__name__}: {result}")
                )
        return errors

    async def connect(self, name: str) -> None:
        node = self.nodes[name]
        await self._close_node(node)
        log.info("[%s] connecting (%s)", name, node.spec.transport)
        transport = transport_for(node.spec)
        node.transport = transport
        await transport.connect()
        cluster = self.spec.cluster
        agent = await transport.start_agent(
            on_event=lambda event: self._on_agent_event(name, event),
            start_timeout=self._connect_timeout_s,
            socket=socket_path(cluster.state_dir, cluster.name, name),
            orphan_grace_s=self.spec.supervisor.orphan_grace_s,
            orchestrator_id=self._orchestrator_id,
        )
        node.agent = agent
        if self._usage_interval_s:
            await agent.watch_usage(self._usage_interval_s)
        watcher = asyncio.create_task(self._watch(name, agent))
        self._watchers.add(watcher)
        watcher.add_done_callback(self._watchers.discard)
        log.info(
            "[%s] agent %s %s (pid %s)",
            name,
            agent.hello.agent_version if agent.hello else "?",
            "reached on its socket, left by a previous run" if agent.attached else "up",
            agent.hello.pid if agent.hello else "?",
        )

    def _on_agent_event(self, name: str, event: Event) -> None:
        if isinstance(event, NodeUsage):
            node = self.nodes[name]
            node.usage, node.usage_at = event, time.monotonic()
        self._on_event(name, event)

    async def fingerprint_all(self, only: list[str] | None = None) -> dict[str, NodeFingerprint]:
        """Every node's fingerprint (of `only`, when given), kept as its latest."""
        async def one(name: str) -> NodeFingerprint:
            fingerprint = await self.agent(name).fingerprint(
                self.spec.model.path, FINGERPRINT_TIMEOUT_S
            )
            self.nodes[name].fingerprint = fingerprint
            return fingerprint

        names = list(self.nodes) if only is None else only
        results = await asyncio.gather(*(one(name) for name in names))
        return dict(zip(names, results, strict=True))

    def fingerprints(self) -> dict[str, NodeFingerprint]:
        """Each node's latest fingerprint, where one was taken."""
        return {name: n.fingerprint for name, n in self.nodes.items() if n.fingerprint}

    async def close_all(self) -> None:
        await asyncio.gather(*(self._close_node(node) for node in self.nodes.values()))

    async def _watch(self, name: str, agent: AgentHandle) -> None:
        exit_info = await asyncio.shield(agent.finished)
        if self.nodes[name].agent is agent:  # not a replaced or deliberately closed agent
            log.warning("[%s] agent lost: %s", name, exit_info.reason)
            self._on_lost(name, exit_info)

    async def _close_node(self, node: NodeConnection) -> None:
        transport, node.transport, node.agent = node.transport, None, None
        if transport is not None:
            await transport.close()
