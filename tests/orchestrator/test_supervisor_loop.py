"""The supervision loop over fakes: scripted gangs, rank 0 and links, on a fake clock."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from contract.agent_protocol import Exited
from contract.exit_codes import RankExit
from orchestrator.config import ClusterSpec
from orchestrator.config.load import check_cluster_data
from orchestrator.launch.gang import Gang, SpawnFailure
from orchestrator.launch.plan import build_plan
from orchestrator.launch.reachability import LinkFailure
from orchestrator.supervision.failures import Cause, RunResult
from orchestrator.supervision.metrics import OrchestratorMetrics
from orchestrator.supervision.monitor import GangMonitor
from orchestrator.supervision.progress import ServingSample
from orchestrator.supervision.state import GangState, StateMachine
from orchestrator.supervision.supervisor import Supervisor
from orchestrator.transports import AgentExit, TransportError
from orchestrator.transports.pool import NodePool
from serving.faults import EBUSY_LINE
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
        self.standby_started = False

    async def start(self) -> list[SpawnFailure]:
        failed = []
        for rank in self.ranks.values():
            if rank.rank == self.fail_spawn:
                message = "cannot start 'python3': [Errno 2] No such file or directory"
                failed.append(SpawnFailure(rank.rank, rank.node, message, permanent=True))
            else:
                rank.pid, rank.started_at = 1000 + rank.rank, time.time()
        return failed

    async def start_standby(self) -> None:
        self.standby_started = True

    async def stop(self, grace_s: float) -> None:
        for rank in self.ranks.values():
            if rank.running:
                if rank.rank in self.echo_on_stop:
                    exited = self.exit(rank.rank, returncode=RankExit.PEER_LOST)
                else:
                    exited = self.exit(rank.rank, signal="SIGTERM", stopped=True)
                self.agent_event(rank.node, exited)  # the agent's Exited event
                self.note_exit(exited)  # and the stop request's reply

    async def leftovers(self) -> list[str]:
        return []

    def exit(self, rank: int, **fields: Any) -> Exited:
        pid = self.ranks[rank].pid or 0
        return Exited(rank=rank, pid=pid, launch_id=self.launch_id, **fields)


class FakePool(NodePool):
    def __init__(self, spec: ClusterSpec) -> None:
        super().__init__(spec, on_event=lambda n, e: None, on_lost=lambda n, x: None)
        self.connect_errors: list[TransportError] = []

    async def connect_all(self) -> list[TransportError]:
        return self.connect_errors


class FakeProbe:
    """Rank 0 healthy at once; its step counter moves on every sample, except for the
    launch whose rank 0 is frozen."""

    def __init__(self) -> None:
        self.frozen_url = ""
        self.steps = 0.0

    async def healthy(self, base_url: str, timeout_s: float) -> bool:
        return True

    async def sample(self, base_url: str) -> ServingSample | None:
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


class Harness:
    def __init__(self, tmp_path: Path, **supervisor: Any) -> None:
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
        self.monitor = GangMonitor(self.pool.nodes, self.metrics, self.clock)
        self.gangs: list[FakeGang] = []
        self.launched_at: list[float] = []  # fake time of each launch
        self.fail_spawn: list[int | None] = []  # per launch, the rank that cannot start
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
            clock=self.clock,
            sleep=self.clock.sleep,
        )

    def _new_gang(self) -> FakeGang:
        fail = self.fail_spawn.pop(0) if self.fail_spawn else None
        gang = FakeGang(self.spec, f"L{len(self.gangs) + 1}", fail, self.monitor.on_agent_event)
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
            lambda: len(self.gangs) == number and self.supervisor.state == GangState.READY,
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
        failure = self.supervisor.snapshot().last_failure
        assert failure is not None
        return self.launched_at[-1] - failure.at


def sample(metrics: OrchestratorMetrics, name: str, **labels: str) -> float:
    value = metrics.registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


@pytest.fixture
def harness(tmp_path: Path) -> Iterator[Callable[..., Harness]]:
    tasks: list[asyncio.Task[RunResult]] = []
    made: list[Harness] = []

    def make(**supervisor: Any) -> Harness:
        h = Harness(tmp_path, **supervisor)
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


async def test_a_crash_stops_the_gang_and_relaunches_after_a_doubling_backoff(harness) -> None:
    """A rank exits: every rank of that gang is stopped, the next launch comes after the
    backoff (counted from the failure), and a second crash waits twice as long."""
    h = harness()
    first = await h.ready_gang(1)
    h.crash(1, returncode=1, stderr_tail=["ValueError: boom"])
    second = await h.ready_gang(2)
    assert all(rank.exited is not None for rank in first.ranks.values())
    assert second.launch_id != first.launch_id and all(r.running for r in second.ranks.values())
    assert h.restarts(Cause.RANK_CRASHED) == 1 and h.backoff() == 2.0 and h.waited() == 2.0
    assert [f.rank for f in h.supervisor.snapshot().history[-1].failures] == [1]  # not the stops
    h.crash(2, signal="SIGKILL")
    await h.ready_gang(3)
    assert h.backoff() == 4.0 and h.waited() == 4.0 and h.restarts(Cause.RANK_CRASHED) == 2
    snapshot = h.supervisor.snapshot()
    assert snapshot.restarts == 2 and snapshot.launch_id == "L3"
    assert snapshot.last_failure is not None and snapshot.last_failure.rank == 2
    result = await stop(h)
    assert result.restarts == 2 and result.last is not None
    assert all(rank.exited is not None for rank in h.gang.ranks.values())


async def test_a_crash_loop_fails_the_cluster_until_restart(harness) -> None:
    """More than max_restarts failures in the window: failed, with the reason; restart
    (SIGHUP) gives a fresh budget and a new launch."""
    h = harness(max_restarts=2)
    for number in (1, 2, 3):
        await h.ready_gang(number)
        h.crash(1, returncode=1)
    await h.until(lambda: h.supervisor.state == GangState.FAILED, "failed")
    assert "more than 2 restarts" in h.supervisor.reason
    h.supervisor.request_restart()
    await h.ready_gang(4)
    h.crash(1, returncode=1)  # the budget is fresh: this one relaunches
    await h.ready_gang(5)
    assert h.restarts(Cause.RANK_CRASHED) == 3


async def test_no_progress_is_a_hang(harness) -> None:
    """Rank 0's step counter frozen past hang_timeout_s (fake time): cause hang, restart."""
    h = harness()
    await h.ready_gang(1)
    h.probe.frozen_url = h.gang.rank0_url
    await h.ready_gang(2)
    failure = h.supervisor.snapshot().last_failure
    assert failure is not None and failure.cause == Cause.HANG
    assert "no engine step for" in failure.detail


async def test_a_lost_agent_is_agent_lost(harness) -> None:
    """The agent of a node that runs a rank is lost: cause agent_lost on that node."""
    h = harness()
    await h.ready_gang(1)
    h.monitor.on_agent_lost("c", AgentExit("the agent's channel closed", None, []))
    await h.ready_gang(2)
    failure = h.supervisor.snapshot().last_failure
    assert failure is not None and (failure.cause, failure.node) == (Cause.AGENT_LOST, "c")


async def test_ebusy_adds_its_cooldown_to_the_backoff(harness) -> None:
    """A JACCL EBUSY line in the exit: the relaunch waits backoff + ebusy_cooldown_s."""
    h = harness()
    await h.ready_gang(1)
    h.crash(0, returncode=RankExit.DISTRIBUTED_INIT_FAILED, stderr_tail=[EBUSY_LINE])
    await h.ready_gang(2)
    assert h.backoff() == 2.0 + 30.0 and h.waited() == 32.0 and h.restarts(Cause.EBUSY) == 1


async def test_the_root_cause_is_the_crash_not_its_peer_lost_echo(harness) -> None:
    """A peer_lost exit reported before the real crash is an echo: the crash is the root."""
    h = harness()
    await h.ready_gang(1)
    h.crash(2, returncode=RankExit.PEER_LOST)
    h.crash(1, signal="SIGKILL")
    await h.ready_gang(2)
    last = h.supervisor.snapshot().history[-1]
    assert [f.cause for f in last.failures] == [Cause.PEER_LOST, Cause.RANK_CRASHED]
    assert (last.root.cause, last.root.rank) == (Cause.RANK_CRASHED, 1)
    assert h.restarts(Cause.PEER_LOST) == 0


async def test_a_peer_lost_echo_while_the_gang_stops_is_kept_as_a_consequence(harness) -> None:
    """A worker's peer_lost exit reported while the failed gang stops joins that gang's
    result; the crash stays the root and only the crash counts as a restart cause."""
    h = harness()
    await h.ready_gang(1)
    h.gang.echo_on_stop = {2}
    h.crash(1, signal="SIGKILL")
    await h.ready_gang(2)
    last = h.supervisor.snapshot().history[-1]
    assert [(f.cause, f.rank) for f in last.failures] == [
        (Cause.RANK_CRASHED, 1),
        (Cause.PEER_LOST, 2),
    ]
    assert last.root.rank == 1 and h.restarts(Cause.PEER_LOST) == 0


async def test_a_rank_the_node_refuses_to_start_fails_the_cluster_at_once(harness) -> None:
    """The agent refuses a spawn (missing interpreter): failed at once, naming the rank, its
    node and the reason, without spending the restart budget; restart tries again."""
    h = harness()
    h.fail_spawn = [1]
    await h.until(lambda: h.supervisor.state == GangState.FAILED, "failed")
    reason = h.supervisor.reason
    assert reason.startswith("spawn_failed: rank 1 on b: cannot start the rank: cannot start")
    assert "No such file or directory" in reason and "orchestrator restart" in reason
    assert h.supervisor.restarts == 0 and len(h.gangs) == 1
    h.supervisor.request_restart()
    await h.ready_gang(2)


async def test_relaunch_waits_for_dead_links(harness) -> None:
    """Links down at the relaunch: it waits, saying so, and launches once they answer."""
    h = harness()
    await h.ready_gang(1)
    h.links.down = True
    h.crash(1, returncode=1)
    await h.until(lambda: "waiting for links" in h.supervisor.reason, "waiting for links")
    assert h.supervisor.reason == "waiting for links: a -> b 10.0.1.2:52101: no answer"
    checks, launches = h.links.checks, len(h.gangs)
    await h.until(lambda: h.links.checks > checks + 2, "checking again")
    assert len(h.gangs) == launches  # nothing launched over the dead link
    h.links.down = False
    await h.ready_gang(2)


async def test_stop_returns_the_result_with_every_rank_stopped(harness) -> None:
    """A stop request ends run() with a RunResult; no rank is left running."""
    h = harness()
    gang = await h.ready_gang(1)
    result = await stop(h)
    assert result == RunResult(restarts=0, last=None)
    assert all(rank.exited is not None and rank.exited.stopped for rank in gang.ranks.values())
    assert h.supervisor.state == GangState.STOPPED
