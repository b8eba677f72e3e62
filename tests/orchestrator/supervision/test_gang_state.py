"""The state machine: allowed transitions, reasons, listeners, time in state."""

from __future__ import annotations

import pytest

from orchestrator.supervision.state import GangState, InvalidTransition, StateMachine
from testkit.fake_clock import FakeClock


def test_happy_path_and_restart_loop() -> None:
    """pending → … → ready ⇄ restarting → launching → ready → stopped, each one notified."""
    clock = FakeClock()
    machine = StateMachine(clock)
    seen: list[tuple[GangState, GangState, str]] = []
    machine.on_change(lambda old, new, reason: seen.append((old, new, reason)))
    path = [
        GangState.CONNECTING,
        GangState.PREFLIGHT,
        GangState.LAUNCHING,
        GangState.READY,
        GangState.RESTARTING,
        GangState.LAUNCHING,
        GangState.READY,
        GangState.STOPPED,
    ]
    for state in path:
        clock.now += 1
        machine.to(state, f"to {state}")
    assert [new for _old, new, _reason in seen] == path
    assert seen[4] == (GangState.READY, GangState.RESTARTING, "to restarting")
    clock.now += 5
    assert machine.seconds_in_state == 5


@pytest.mark.parametrize(
    ("start", "bad"),
    [
        (GangState.PENDING, GangState.READY),
        (GangState.READY, GangState.LAUNCHING),
        (GangState.STOPPED, GangState.LAUNCHING),
        (GangState.PREFLIGHT, GangState.RESTARTING),
    ],
)
def test_invalid_transitions_raise(start: GangState, bad: GangState) -> None:
    """A transition the diagram does not draw is a bug, refused loudly."""
    machine = StateMachine(FakeClock())
    machine.state = start
    with pytest.raises(InvalidTransition):
        machine.to(bad)


def test_failed_can_be_restarted_or_stopped() -> None:
    """failed → launching (orchestrator restart) and failed → stopped are allowed."""
    for target in (GangState.LAUNCHING, GangState.STOPPED):
        machine = StateMachine(FakeClock())
        machine.state = GangState.FAILED
        machine.to(target)
        assert machine.state == target
