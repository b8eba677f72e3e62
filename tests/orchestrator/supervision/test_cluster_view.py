"""What the gateway reads of a supervisor: two views side by side in one process, each
answering for its own cluster only."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from orchestrator.supervision.cluster_view import SupervisorView
from orchestrator.supervision.state import GangState, StateMachine
from testkit.fake_clock import FakeClock


def view(name: str) -> SupervisorView:
    clock = FakeClock()
    machine = StateMachine(clock)
    machine.to(GangState.CONNECTING)
    machine.to(GangState.PREFLIGHT)
    machine.to(GangState.LAUNCHING)
    shown = SupervisorView(machine, clock)
    plan = SimpleNamespace(secret=f"secret-{name}")
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
