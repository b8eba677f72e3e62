"""Fakes for the supervision loop: scripted gangs, rank 0, links and node answers, on a
fake clock; the `harness` fixture runs a Supervisor over them."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from contract.agent_protocol import Exited, RdmaHolder
from contract.exit_codes import RankExit
from orchestrator.config import ClusterSpec
from orchestrator.config.load import check_cluster_data
from orchestrator.launch.gang import Gang, SpawnFailure
from orchestrator.launch.plan import build_plan
from orchestrator.launch.reachability import LinkFailure
from orchestrator.supervision.failures import Cause, RunResult
from orchestrator.supervision.fewer_nodes import Shrink
from orchestrator.supervision.metrics import OrchestratorMetrics
from orchestrator.supervision.monitor import GangMonitor
from orchestrator.supervision.progress import ServingSample
from orchestrator.supervision.state import GangState, StateMachine
from orchestrator.supervision.supervisor import Supervisor
from orchestrator.transports import TransportError
from orchestrator.transports.pool import NodePool
from testkit.fake_clock import FakeClock


class FakeGang(Gang):
    """A launch whose ranks 'start' and 'stop' at once; exits come from the test, and a
    stop's exits reach the monitor as the agents report them."""

    def __init__(
        self,
        spec: ClusterSpec,
        launch_id: str,
        fail_spawn: int | None,
        agent_event: Callable[[str, Exited], None],
    ) -> None:
        super().__init__(build_plan(spec, launch_id), pool=None)  # type: ignore[arg-type]
        self.fail_spawn = fail_spawn
        self.agent_event = agent_event
        self.echo_on_stop: set[int] = set()  # ranks that exit peer_lost before their SIGTERM
        self.exit_on_start: dict[str, Any] | None = None  # rank 0 exits so once started
        self.silent_node = ""  # a node asleep: its ranks' stop is never confirmed
        self.standby_started = False

    async def start(self) -> list[SpawnFailure]:
        failed = []
        for rank in self.ranks.values():
            if rank.rank == self.fail_spawn:
                message = "cannot start 'python3': [Errno 2] No such file or directory"
                failed.append(SpawnFailure(rank.rank, rank.node, message, permanent=True))
            else:
                rank.pid, rank.started_at = 1000 + rank.rank, time.time()
        if self.exit_on_start is not None and not failed:
            self.agent_event(self.ranks[0].node, self.exit(0, **self.exit_on_start))
        return failed

    async def start_standby(self) -> None:
        self.standby_started = True

    async def stop(self, grace_s: float) -> None:
        for rank in self.ranks.values():
            if rank.running and rank.node != self.silent_node:
                if rank.rank in self.echo_on_stop:
                    exited = self.exit(rank.rank, returncode=RankExit.PEER_LOST)
                else:
                    exited = self.exit(rank.rank, signal="SIGTERM", stopped=True)
                self.agent_event(rank.node, exited)  # the agent's Exited event
                self.note_exit(exited)  # and the stop request's reply
        if any(r.running and r.node == self.silent_node for r in self.ranks.values()):
            await asyncio.Event().wait()  # the reply never comes

    async def leftovers(self) -> list[str]:
        return []

    def exit(self, rank: int, **fields: Any) -> Exited:
        pid = self.ranks[rank].pid or 0
        return Exited(rank=rank, pid=pid, launch_id=self.launch_id, **fields)


class FakePool(NodePool):
    def __init__(self, spec: ClusterSpec) -> None:
        super().__init__(spec, on_event=lambda n, e: None, on_lost=lambda n, x: None)
        self.connect_errors: list[TransportError] = []

    async def connect_all(self, only: list[str] | None = None) -> list[TransportError]:
        return [e for e in self.connect_errors if only is None or e.node in only]


class FakeProbe:
    """Rank 0 healthy at once; its step counter moves on every sample, except for the
    launch whose rank 0 is frozen."""

    def __init__(self) -> None:
        self.frozen_url = ""
        self.steps = 0.0

    async def healthy(self, base_url: str, timeout_s: float, tls_cert: str = "") -> bool:
        return True

    async def sample(self, base_url: str, tls_cert: str = "") -> ServingSample | None:
        if base_url != self.frozen_url:
            self.steps += 1
        return ServingSample(steps=self.steps, last_step_timestamp=self.steps)


class FakeLinks:
    def __init__(self) -> None:
        self.down = False
        self.checks = 0

    async def check(self) -> list[LinkFailure]:
        self.checks += 1
        if self.down:
            return [LinkFailure("a", "b", "10.0.1.2:52101", "nodes[1].ip", "no answer")]
        return []

    async def watch(self) -> None: ...

    async def unwatch(self) -> None: ...


class FakeAnswers:
    """Nodes answer unless the test names them in `away` (node -> error)."""

    def __init__(self) -> None:
        self.away_nodes: dict[str, str] = {}
        self.asked = 0

    async def away(self, names: list[str]) -> dict[str, str]:
        self.asked += 1
        return {name: error for name, error in self.away_nodes.items() if name in names}


class FakeHolders:
    """The RDMA devices' holders the test names in `found`; `ended` records each end."""

    def __init__(self) -> None:
        self.found: dict[str, list[RdmaHolder]] = {}
        self.ended: list[tuple[str, int]] = []

    async def find(self, nodes: list[str]) -> dict[str, list[RdmaHolder]]:
        return {node: list(found) for node, found in self.found.items() if node in nodes}

    async def end(self, node: str, holder: RdmaHolder) -> bool:
        self.ended.append((node, holder.pid))
        self.found[node] = [h for h in self.found.get(node, []) if h.pid != holder.pid]
        return True


class Harness:
    def __init__(self, tmp_path: Path, fewer: bool = False, **supervisor: Any) -> None:
        """fewer: the supervisor can launch a gang on the nodes that remain (as `up`'s)."""
        # Fake time runs while a gang is ready (a watch every real_pause_s): a long reset
        # and window keep a slow test machine from resetting the backoff or the budget.
        settings = {
            "backoff_initial_s": 2.0,
            "backoff_max_s": 60.0,
            "backoff_reset_after_s": 1e6,
            "restart_window_s": 1e6,
            "hang_timeout_s": 5.0,
            "ebusy_cooldown_s": 30.0,
            "standby_ranks": False,
            **supervisor,
        }
        data = {
            "cluster": {"state_dir": str(tmp_path)},
            "supervisor": settings,
            "nodes": [{"name": n, "ip": "127.0.0.1"} for n in ("a", "b", "c")],
        }
        self.spec, _ = check_cluster_data(data, tmp_path / "cluster.toml")
        self.clock = FakeClock(real_pause_s=0.002)
        self.metrics = OrchestratorMetrics()
        self.pool = FakePool(self.spec)
        self.probe = FakeProbe()
        self.links = FakeLinks()
        self.answers = FakeAnswers()
        self.holders = FakeHolders()
        self.monitor = GangMonitor(self.pool.nodes, self.metrics, self.clock)
        self.gangs: list[FakeGang] = []
        self.launched_at: list[float] = []  # fake time of each launch
        self.fail_spawn: list[int | None] = []  # per launch, the rank that cannot start
        self.start_exits: list[dict[str, Any] | None] = []  # per launch, rank 0's exit at start
        self.reasons: list[str] = []
        machine = StateMachine(self.clock)
        machine.on_change(lambda old, new, reason: self.reasons.append(f"{new}: {reason}"))
        machine.to(GangState.CONNECTING)  # as the service leaves it after preflight
        machine.to(GangState.PREFLIGHT)
        self.supervisor = Supervisor(
            self.spec,
            self.pool,
            self.metrics,
            machine,
            self.monitor,
            self.probe,
            self._new_gang,
            links=self.links,
            answers=self.answers,
            holders=self.holders,
            fewer_gang=self._fewer_gang if fewer else None,
            clock=self.clock,
            sleep=self.clock.sleep,
        )

    def _fewer_gang(self, shrink: Shrink) -> FakeGang:
        return self._new_gang(shrink.spec)

    def _new_gang(self, spec: ClusterSpec | None = None) -> FakeGang:
        fail = self.fail_spawn.pop(0) if self.fail_spawn else None
        gang = FakeGang(spec or self.spec, f"L{len(self.gangs) + 1}", fail,
                        self.monitor.on_agent_event)
        gang.exit_on_start = self.start_exits.pop(0) if self.start_exits else None
        self.gangs.append(gang)
        self.launched_at.append(self.clock())
        return gang

    @property
    def gang(self) -> FakeGang:
        return self.gangs[-1]

    async def until(self, check: Callable[[], bool], what: str) -> None:
        for _ in range(500):
            if check():
                return
            await asyncio.sleep(0.01)
        raise AssertionError(f"not {what}; states: {self.reasons}")

    async def ready_gang(self, number: int) -> FakeGang:
        await self.until(
            lambda: len(self.gangs) == number and self.supervisor.view.state == GangState.READY,
            f"ready with gang {number}",
        )
        return self.gang

    def crash(self, rank: int, **fields: Any) -> None:
        node = self.spec.nodes[rank].name
        self.monitor.on_agent_event(node, self.gang.exit(rank, **fields))

    def restarts(self, cause: Cause) -> float:
        return sample(self.metrics, "orchestrator_restarts_total", cause=cause.value)

    def backoff(self) -> float:
        """The delay the restart policy chose for the latest relaunch."""
        return sample(self.metrics, "orchestrator_restart_backoff_seconds")

    def waited(self) -> float:
        """Fake seconds from the latest gang failure to the launch that followed it."""
        failure = self.supervisor.view.snapshot().last_failure
        assert failure is not None
        return self.launched_at[-1] - failure.at


def sample(metrics: OrchestratorMetrics, name: str, **labels: str) -> float:
    value = metrics.registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


@pytest.fixture
def harness(tmp_path: Path) -> Iterator[Callable[..., Harness]]:
    tasks: list[asyncio.Task[RunResult]] = []
    made: list[Harness] = []

    def make(fewer: bool = False, **supervisor: Any) -> Harness:
        h = Harness(tmp_path, fewer, **supervisor)
        h.task = asyncio.ensure_future(h.supervisor.run())  # type: ignore[attr-defined]
        tasks.append(h.task)  # type: ignore[attr-defined]
        made.append(h)
        return h

    yield make
    for task in tasks:
        task.cancel()


async def stop(h: Harness) -> RunResult:
    h.supervisor.request_stop()
    return await asyncio.wait_for(h.task, 5)  # type: ignore[attr-defined]


