"""Backoff, cool-down and the crash-loop budget, on a fake clock."""

from __future__ import annotations

import pytest

from orchestrator.config.spec import SupervisorSection
from orchestrator.supervision.failures import Cause
from orchestrator.supervision.restart_policy import RestartPolicy
from testkit.fake_clock import FakeClock


def policy(**overrides: float) -> tuple[RestartPolicy, FakeClock]:
    clock = FakeClock()
    return RestartPolicy(SupervisorSection(**overrides), clock), clock  # type: ignore[arg-type]


def test_backoff_doubles_to_the_cap() -> None:
    """Consecutive failures wait 1, 2, 4, ... seconds, never more than the cap."""
    restarts, _clock = policy(max_restarts=100, backoff_initial_s=1, backoff_max_s=10)
    delays = [restarts.next_delay(Cause.RANK_CRASHED) for _ in range(6)]
    assert delays == [1, 2, 4, 8, 10, 10]


def test_ebusy_adds_its_cooldown() -> None:
    """An EBUSY waits the RDMA cool-down on top of the backoff."""
    restarts, _clock = policy(backoff_initial_s=1, ebusy_cooldown_s=30)
    assert restarts.next_delay(Cause.EBUSY) == 31
    assert restarts.next_delay(Cause.HANG) == 2


def test_long_ready_stretch_resets_backoff() -> None:
    """After backoff_reset_after_s ready, the next failure starts from the initial delay."""
    restarts, clock = policy(backoff_initial_s=1, backoff_reset_after_s=600, max_restarts=10)
    for _ in range(3):
        restarts.next_delay(Cause.RANK_CRASHED)
    ready_since = clock.now
    clock.now += 599
    restarts.note_ready(ready_since)
    assert restarts.next_delay(Cause.RANK_CRASHED) == 8
    ready_since = clock.now
    clock.now += 600
    restarts.note_ready(ready_since)
    assert restarts.next_delay(Cause.RANK_CRASHED) == 1


@pytest.mark.parametrize("max_restarts", [0, 1, 3])
def test_budget_exhausted_after_max_restarts_in_window(max_restarts: int) -> None:
    """max_restarts restarts are allowed within the window; the next one is not."""
    restarts, _clock = policy(max_restarts=max_restarts, restart_window_s=600)
    for _ in range(max_restarts):
        assert not restarts.budget_exhausted()
        restarts.next_delay(Cause.RANK_CRASHED)
    assert restarts.budget_exhausted()


def test_budget_window_slides() -> None:
    """Restarts older than the window no longer count."""
    restarts, clock = policy(max_restarts=2, restart_window_s=100)
    restarts.next_delay(Cause.RANK_CRASHED)
    clock.now += 60
    restarts.next_delay(Cause.RANK_CRASHED)
    assert restarts.budget_exhausted()
    clock.now += 41
    assert not restarts.budget_exhausted()
    assert restarts.restarts_in_window == 1


def test_reset_gives_a_fresh_budget() -> None:
    """`orchestrator restart` clears the budget and the backoff."""
    restarts, _clock = policy(max_restarts=1, backoff_initial_s=1)
    restarts.next_delay(Cause.RANK_CRASHED)
    assert restarts.budget_exhausted()
    restarts.reset()
    assert not restarts.budget_exhausted()
    assert restarts.next_delay(Cause.RANK_CRASHED) == 1
