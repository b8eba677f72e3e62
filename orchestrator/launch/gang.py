"""One launch of the serving job: a rank per node, started, tracked and stopped together."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

from contract import rank_env
from contract.adoption import LaunchRecord
from contract.agent_protocol import Exited, RankInfo, Spawn
from orchestrator.launch.plan import LaunchPlan, RankLaunch
from orchestrator.state_file import RankRecord
from orchestrator.transports import AgentRequestError, TransportError
from orchestrator.transports.pool import NodePool

log = logging.getLogger(__name__)


@dataclass
class LaunchedRank:
    """One rank of a launch as the orchestrator tracks it (the process runs on its node)."""

    rank: int
    node: str
    pid: int | None = None
    started_at: float = 0.0  # time.time()
    exited: Exited | None = None

    @property
    def running(self) -> bool:
        return self.pid is not None and self.exited is None


@dataclass(frozen=True)
class SpawnFailure:
    """A rank its agent could not start."""

    rank: int
    node: str
    message: str
    # The agent refused (no such interpreter, permission, E2BIG, bad cwd): no restart can
    # fix it. Otherwise the node could not be reached, which may pass.
    permanent: bool = False


class Gang:
    def __init__(
        self, plan: LaunchPlan, pool: NodePool, record: LaunchRecord | None = None
    ) -> None:
        self.plan = plan
        self.pool = pool
        self.record = record  # given to each agent with the ranks, for a later adopter
        self.adopted = False  # its ranks were running already, started by an earlier run
        self.ranks = {launch.rank: LaunchedRank(launch.rank, launch.node) for launch in plan.ranks}

    def adopt(self, running: list[RankInfo]) -> None:
        """Take over these running ranks of this launch (orchestrator/launch/adoption.py)."""
        self.adopted = True
        for info in running:
            if info.rank in self.ranks and info.launch_id == self.launch_id:
                self.ranks[info.rank].pid = info.pid
                self.ranks[info.rank].started_at = info.started_at

    @property
    def launch_id(self) -> str:
        return self.plan.launch_id

    @property
    def rank0_url(self) -> str:
        return self.plan.rank0_url

    async def start(self) -> list[SpawnFailure]:
        """Rank 0 first (it hosts the coordinator and the API), the others once it is up.

        Returns every rank that could not be started (none: all run)."""
        if self.adopted:
            return []
        first, *rest = self.plan.ranks
        failed = await self._spawn(first)
        if failed is not None:
            return [failed]
        results = await asyncio.gather(*(self._spawn(launch) for launch in rest))
        return [failure for failure in results if failure is not None]

    async def start_standby(self) -> None:
        """Have each node start this (future) launch's rank and hold it (best effort)."""
        replies = await asyncio.gather(
            *(
                self.pool.agent(launch.node).spawn(self._request(launch, standby=True))
                for launch in self.plan.ranks
            ),
            return_exceptions=True,
        )
        for launch, reply in zip(self.plan.ranks, replies, strict=True):
            if isinstance(reply, BaseException):
                log.warning("no standby for rank %d on %s: %s", launch.rank, launch.node, reply)
            else:
                log.info("rank %d standby on %s: pid %d, launch %s",
                         launch.rank, launch.node, reply.pid, self.launch_id)

    def _request(self, launch: RankLaunch, standby: bool = False) -> Spawn:
        return Spawn(
            rank=launch.rank,
            argv=launch.argv,
            env=launch.env,
            cwd=launch.cwd,
            files=launch.files,
            log_file=f"{launch.cwd}/{rank_env.LOG_FILE}",
            standby=standby,
            launch=self.record,
        )

    async def _spawn(self, launch: RankLaunch) -> SpawnFailure | None:
        try:
            reply = await self.pool.agent(launch.node).spawn(self._request(launch))
        except AgentRequestError as exc:
            return SpawnFailure(launch.rank, launch.node, exc.message, permanent=True)
        except TransportError as exc:
            return SpawnFailure(launch.rank, launch.node, exc.message)
        process = self.ranks[launch.rank]
        process.pid, process.started_at = reply.pid, time.time()
        log.info(
            "rank %d started on %s: pid %d, launch %s",
            launch.rank,
            launch.node,
            reply.pid,
            self.launch_id,
        )
        return None

    def note_exit(self, exited: Exited) -> LaunchedRank | None:
        """Record an Exited event if it belongs to this launch; returns the rank it ended."""
        process = self.ranks.get(exited.rank)
        if process is None or exited.launch_id != self.launch_id or exited.pid != process.pid:
            return None
        process.exited = exited
        return process

    def unconfirmed(self) -> list[RankRecord]:
        """Ranks whose end no agent reported (their agent was lost): to reap by PID later.

        On Linux they die with their agent; on macOS they may outlive it."""
        return [
            RankRecord(rank=p.rank, node=p.node, pid=p.pid, launch_id=self.launch_id)
            for p in self.ranks.values()
            if p.running and p.pid is not None
        ]

    async def stop(self, grace_s: float) -> None:
        """SIGTERM every running rank's process group, SIGKILL after grace_s; all nodes at once."""
        running = [process for process in self.ranks.values() if process.running]
        await asyncio.gather(*(self._stop_one(process, grace_s) for process in running))

    async def _stop_one(self, process: LaunchedRank, grace_s: float) -> None:
        try:
            for exited in await self.pool.agent(process.node).stop(process.rank, grace_s):
                self.note_exit(exited)
        except (TransportError, AgentRequestError) as exc:
            # A lost agent takes its ranks with it (it stops them when its channel closes).
            log.warning("stopping rank %d on %s: %s", process.rank, process.node, exc)

    async def wake_workers(self) -> None:
        """End the workers' idle sleep (best effort): a request is on its way to rank 0."""
        nodes = {p.node for p in self.ranks.values() if p.rank >= 1 and p.running}
        await asyncio.gather(*(self._wake(node) for node in nodes))

    async def _wake(self, node: str) -> None:
        try:
            await self.pool.agent(node).wake(self.launch_id)
        except (TransportError, AgentRequestError) as exc:
            log.debug("waking the ranks on %s: %s", node, exc)  # they wake by themselves too

    async def leftovers(self) -> list[str]:
        """Ranks of this launch that any reachable agent still runs (should be none)."""
        found: list[str] = []
        for name in {launch.node for launch in self.plan.ranks}:
            try:
                infos = await self.pool.agent(name).list_ranks()
            except (TransportError, AgentRequestError):
                continue
            found += [
                f"rank {info.rank} pid {info.pid} on {name}"
                for info in infos
                if info.launch_id == self.launch_id
            ]
        return found
