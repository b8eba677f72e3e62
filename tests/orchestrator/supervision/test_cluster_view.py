"""What the gateway reads of a supervisor: two views side by side in one process, each
answering for its own cluster only."""

from __future__ import annotations

import asyncio
from collections import deque
from types import SimpleNamespace

from orchestrator.supervision.cluster_view import SupervisorView
from orchestrator.supervision.failures import Cause, RankFailure
from orchestrator.supervision.state import GangState, StateMachine
from testkit.fake_clock import FakeClock
from testkit.supervisor_harness import stop


def view(name: str) -> SupervisorView:
    clock = FakeClock()
    machine = StateMachine(clock)
    machine.to(GangState.CONNECTING)
    machine.to(GangState.PREFLIGHT)
    machine.to(GangState.LAUNCHING)
    shown = SupervisorView(machine, clock)
    plan = SimpleNamespace(secret=f"secret-{name}", tls_cert="")
    shown.gang = SimpleNamespace(  # type: ignore[assignment]
        rank0_url=f"http://{name}:8000", launch_id=f"launch-{name}", plan=plan, ranks={}
    )
    return shown


async def test_two_views_each_hand_out_only_their_own_ready_rank_0() -> None:
    """A waiter on each; only the view whose gang became ready answers, with its own
    rank 0; the other still waits, and its snapshot stays its own."""
    first, second = view("a"), view("b")
    waiting = [asyncio.ensure_future(v.wait_for_upstream(5.0)) for v in (first, second)]
    await asyncio.sleep(0.01)
    first.machine.to(GangState.READY, "serving")
    upstream = await asyncio.wait_for(waiting[0], 1.0)
    assert upstream is not None and (upstream.url, upstream.secret) == ("http://a:8000", "secret-a")
    await asyncio.sleep(0.05)
    assert not waiting[1].done()
    assert second.snapshot().state == GangState.LAUNCHING
    assert first.snapshot().launch_id == "launch-a" and second.snapshot().launch_id == "launch-b"
    second.begin_drain()  # its shutdown ends its own waiters only
    assert await asyncio.wait_for(waiting[1], 1.0) is None
    assert not first.draining


async def test_two_supervisors_in_one_process_fail_and_restart_apart(harness) -> None:
    """Two supervision loops side by side (one per model instance): a crash in one
    restarts that one only; the other's gang, view and counts are untouched."""
    crashing, steady = harness(), harness()
    crashed = await crashing.ready_gang(1)
    kept = await steady.ready_gang(1)
    crashing.crash(1, returncode=1)
    await crashing.ready_gang(2)
    assert crashing.supervisor.view.restarts == 1
    # The crash, noted for the gateway under the launch it ended (a suspect's cause)
    noted = await crashing.supervisor.view.failure_of(crashed.launch_id, 0.0)
    assert noted is not None and (noted.cause, noted.exit_code) == (Cause.RANK_CRASHED, 1)
    assert await steady.supervisor.view.failure_of(kept.launch_id, 0.0) is None
    assert steady.supervisor.view.restarts == 0 and steady.supervisor.view.history == deque()
    assert steady.supervisor.view.gang is kept and all(r.running for r in kept.ranks.values())
    assert steady.supervisor.view.state == GangState.READY
    await stop(crashing)
    assert steady.supervisor.view.state == GangState.READY
    await stop(steady)


async def test_a_launch_failure_is_handed_to_the_waiting_gateway() -> None:
    """The gateway asks how launch L failed: it waits while L serves, gets the failure the
    supervisor noted; a launch that ended without one (stopped) answers None at once."""
    shown = view("a")
    shown.machine.to(GangState.READY, "serving")
    asking = asyncio.ensure_future(shown.failure_of("launch-a", 5.0))
    await asyncio.sleep(0.05)
    assert not asking.done()
    killed = RankFailure(Cause.RANK_CRASHED, "a", 0, "SIGKILL", 0.0, signal="SIGKILL")
    shown.note_failure("launch-a", killed)
    assert await asyncio.wait_for(asking, 1.0) is killed
    shown.machine.to(GangState.STOPPED, "stop requested")
    assert await asyncio.wait_for(shown.failure_of("launch-b", 5.0), 0.5) is None
