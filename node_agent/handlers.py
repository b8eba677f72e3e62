"""The agent's answers: one handler per request type, and the one table from type to handler.

`Open`, the handshake, is not in it: the agent (node_agent/agent.py) answers it before any
other request, and sends each handler's reply, or `error_reply`'s, to the session that asked.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from contract.adoption import Adopt, LaunchRecord
from contract.agent_protocol import (
    CheckPorts,
    Connect,
    FindRdmaHolders,
    Fingerprint,
    FingerprintResult,
    Listen,
    ListRanks,
    Message,
    Ok,
    Ping,
    Pong,
    PortsResult,
    RankList,
    RdmaHolders,
    Reap,
    Reaped,
    Spawn,
    Spawned,
    Stop,
    Stopped,
    Unlisten,
    Wake,
    WatchLinks,
    WatchUsage,
)
from contract.model_manifest import (
    ModelFetch,
    ModelFinalize,
    ModelManifest,
    ModelPrefixHash,
    ModelPrepare,
    ModelServe,
)
from node_agent import host_ops, links, rdma_holders
from node_agent.agent_requests import ModelFileRequest, model_request
from node_agent.fingerprint import collect_fingerprint
from node_agent.links import LinkProbes
from node_agent.models import relay
from node_agent.orphan import OrphanGrace
from node_agent.ranks import RankTable
from node_agent.usage import UsageReporter

log = logging.getLogger("node_agent")


@dataclass(frozen=True)
class Route:
    """How the agent answers one request type."""

    handle: Callable[[Any], Awaitable[Message]]
    waits: bool = False  # grace periods, tools, file work: answered out of order


class Handlers:
    """What the requests act on: the ranks, link probes, usage reports, the orphan grace."""

    def __init__(
        self, ranks: RankTable, probes: LinkProbes, usage: UsageReporter, orphan: OrphanGrace
    ) -> None:
        self._ranks, self._links, self._usage, self._orphan = ranks, probes, usage, orphan
        self.digest: str | None = None  # of the code this agent runs, once computed
        self._launch: LaunchRecord | None = None  # the running gang's, for an adopter

    def table(self) -> dict[type, Route]:
        """The one table from request type to handler (Open, the handshake, is not in it:
        `_handle_line` answers it before any other)."""
        return {
            Ping: Route(self._ping),
            ListRanks: Route(self._list_ranks),
            Spawn: Route(self._spawn),
            Adopt: Route(self._adopt),
            Stop: Route(self._stop_ranks, waits=True),
            Reap: Route(self._reap, waits=True),
            Fingerprint: Route(self._fingerprint, waits=True),
            CheckPorts: Route(self._check_ports),
            Listen: Route(self._listen),
            Unlisten: Route(self._unlisten),
            Connect: Route(self._connect, waits=True),
            WatchUsage: Route(self._watch_usage),
            Wake: Route(self._wake),
            WatchLinks: Route(self._watch_links),
            FindRdmaHolders: Route(self._find_rdma_holders),
            ModelManifest: Route(self._model_files, waits=True),
            ModelPrepare: Route(self._model_files, waits=True),
            ModelPrefixHash: Route(self._model_files, waits=True),
            ModelFinalize: Route(self._model_files, waits=True),
            ModelServe: Route(relay.handle, waits=True),
            ModelFetch: Route(relay.handle, waits=True),
        }

    async def _ping(self, req: Ping) -> Message:
        return Pong(id=req.id, agent_time=time.time(), ranks=len(self._ranks))

    async def _list_ranks(self, req: ListRanks) -> Message:
        return RankList(id=req.id, ranks=self._ranks.infos(),
                        launch=self._launch if len(self._ranks) else None,
                        orphaned_since=self._orphan.since)

    async def _spawn(self, req: Spawn) -> Message:
        started = await self._ranks.spawn(req)
        if not req.standby:
            self._launch = req.launch
            self._orphan.adopted()
        return Spawned(id=req.id, rank=req.rank, pid=started.proc.pid)

    async def _adopt(self, req: Adopt) -> Message:
        self._orphan.adopted()
        log.info("an orchestrator adopted launch %s", req.launch_id)
        return Ok(id=req.id)

    async def _stop_ranks(self, req: Stop) -> Message:
        if req.rank is not None and not self._ranks.has(req.rank):
            raise KeyError(req.rank)
        return Stopped(id=req.id, exits=await self._ranks.stop(req.rank, req.grace_s))

    async def _reap(self, req: Reap) -> Message:
        """One of our ranks is stopped (and leaves the table); any other process by pid."""
        rank = self._ranks.rank_of(req.pid, req.launch_id)
        if rank is not None:
            await self._ranks.stop(rank, req.grace_s)
            return Reaped(id=req.id, pid=req.pid, killed=True, reason="ended")
        killed, reason = await asyncio.to_thread(
            host_ops.reap, req.pid, req.launch_id, req.grace_s
        )
        return Reaped(id=req.id, pid=req.pid, killed=killed, reason=reason)

    async def _fingerprint(self, req: Fingerprint) -> Message:
        fp = await asyncio.to_thread(collect_fingerprint, req.model, self.digest)
        return FingerprintResult(id=req.id, fingerprint=fp)

    async def _check_ports(self, req: CheckPorts) -> Message:
        return PortsResult(id=req.id, in_use=host_ops.ports_in_use(req.host, req.ports))

    async def _listen(self, req: Listen) -> Message:
        await self._links.listen(req.host, req.port)
        return Ok(id=req.id)

    async def _unlisten(self, req: Unlisten) -> Message:
        await self._links.unlisten(req.host, req.port)
        return Ok(id=req.id)

    async def _connect(self, req: Connect) -> Message:
        return await links.connect(req.host, req.port, req.timeout_s, req.id)

    async def _watch_usage(self, req: WatchUsage) -> Message:
        self._usage.watch(req.interval_s)
        return Ok(id=req.id)

    async def _wake(self, req: Wake) -> Message:
        self._ranks.wake_workers(req.launch_id)
        return Ok(id=req.id)

    async def _watch_links(self, req: WatchLinks) -> Message:
        await self._links.watch(req.targets, req.interval_s, req.timeout_s, req.down_after)
        return Ok(id=req.id)

    async def _find_rdma_holders(self, req: FindRdmaHolders) -> Message:
        holders = await asyncio.to_thread(rdma_holders.find_holders)
        return RdmaHolders(id=req.id, holders=holders)

    async def _model_files(self, req: ModelFileRequest) -> Message:  # hashing: in a thread
        return await asyncio.to_thread(model_request, req)
