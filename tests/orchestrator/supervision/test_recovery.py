"""What follows a failed gang, decided without the loop (recovery.decide, fake clock)."""

from __future__ import annotations

from orchestrator.config.spec import SupervisorSection
from orchestrator.supervision.failures import Cause, GangResult, RankFailure
from orchestrator.supervision.recovery import (
    Backoff,
    ClearEbusy,
    Fail,
    WaitNodes,
    asks_who_is_away,
    decide,
)
from orchestrator.supervision.restart_policy import RestartPolicy
from testkit.fake_clock import FakeClock

AWAY = {"b": "no answer on port 22"}


def policy(**overrides: float) -> RestartPolicy:
    settings = {"backoff_initial_s": 2.0, "backoff_max_s": 60.0, "max_restarts": 3,
                "restart_window_s": 300.0, "ebusy_cooldown_s": 30.0, **overrides}
    return RestartPolicy(SupervisorSection(**settings), FakeClock())  # type: ignore[arg-type]


def result(cause: Cause, at: float = 1000.0, echo_at: float | None = None) -> GangResult:
    """A gang whose root failure is `cause` at `at`; echo_at: a peer_lost echo noticed then."""
    failures = [RankFailure(cause, "a", 0, "detail", at)]
    if echo_at is not None:
        failures.append(RankFailure(Cause.PEER_LOST, "b", 1, "peer lost", echo_at))
    return GangResult.of(failures)


def test_a_spawn_failure_fails_at_once_without_asking_the_nodes() -> None:
    """No restart can fix a rank the node refuses to start: Fail, even with budget left."""
    spawn = result(Cause.SPAWN_FAILED)
    assert not asks_who_is_away(spawn)
    decision = decide(spawn, None, policy(), ebusy_retried=False)
    assert isinstance(decision, Fail)
    assert "no restart can fix that" in decision.reason
    assert "orchestrator restart" in decision.reason


def test_a_node_away_is_waited_for_from_the_first_report_whatever_the_cause() -> None:
    """A node away wins over EBUSY and a spent budget; the wait counts from the earliest report."""
    spent = policy(max_restarts=1)
    spent.record()
    for cause in (Cause.RANK_CRASHED, Cause.EBUSY, Cause.LINK_DOWN):
        gang = result(cause, at=1005.0, echo_at=1002.0)  # the echo reached us first
        assert asks_who_is_away(gang)
        assert decide(gang, AWAY, spent, ebusy_retried=True) == WaitNodes(AWAY, 1002.0)


def test_ebusy_clears_the_holders_and_retries_once_after_the_cooldown() -> None:
    """EBUSY: one retry at the first report + ebusy_cooldown_s; none once it was spent."""
    gang = result(Cause.EBUSY, at=1005.0, echo_at=1001.0)
    first = decide(gang, {}, policy(), ebusy_retried=False)
    assert first == ClearEbusy(gang.root, retry=True, retry_at=1031.0)
    again = decide(gang, {}, policy(), ebusy_retried=True)
    assert isinstance(again, ClearEbusy) and not again.retry


def test_a_spent_budget_fails_naming_the_limit_and_the_last_failure() -> None:
    """max_restarts restarts within the window: Fail, with both numbers and the root cause."""
    spent = policy(max_restarts=2, restart_window_s=120.0)
    spent.record()
    spent.record()
    decision = decide(result(Cause.HANG), {}, spent, ebusy_retried=False)
    assert isinstance(decision, Fail)
    assert decision.reason.startswith("more than 2 restarts within 120 s; last: hang: rank 0 on a")


def test_otherwise_a_backoff_that_doubles_counted_from_the_first_report() -> None:
    """The delay doubles per restart recorded; the relaunch is that long after the first
    report; deciding records nothing (the same answer twice)."""
    restarts = policy()
    gang = result(Cause.RANK_CRASHED, at=1003.0, echo_at=1001.0)
    delays = []
    for _ in range(3):
        decision = decide(gang, {}, restarts, ebusy_retried=False)
        assert decision == decide(gang, {}, restarts, ebusy_retried=False)
        assert isinstance(decision, Backoff) and decision.cause == Cause.RANK_CRASHED
        assert decision.relaunch_at == 1001.0 + decision.delay
        delays.append(decision.delay)
        restarts.record()
    assert delays == [2.0, 4.0, 8.0]
