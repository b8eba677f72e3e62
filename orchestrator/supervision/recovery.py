"""What to do after a gang failed, as a value: the supervision loop asks the nodes who is
away, calls `decide`, and carries the decision out (waits, ends holders, sleeps).

    spawn failed ─────────────────────────────────────────▶ Fail (no restart can fix it)
    a node away ──────────────────────────────────────────▶ WaitNodes (no restart spent)
    ebusy ────────────────────────────────────────────────▶ ClearEbusy (one retry)
    more than max_restarts within restart_window_s ───────▶ Fail
    else ─────────────────────────────────────────────────▶ Backoff (+ cause cool-down)

Pure: nothing here sleeps, asks a node or records a restart, so each rule is tested on
its own without the loop.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from orchestrator.supervision.failures import Cause, GangResult, RankFailure
from orchestrator.supervision.restart_policy import RestartPolicy


@dataclass(frozen=True)
class Fail:
    """Failed until `orchestrator restart`, with this reason."""

    reason: str


@dataclass(frozen=True)
class WaitNodes:
    """Wait for the nodes away to answer again (node_wait_s at most); `since`: when the
    failure that revealed them was noticed."""

    away: Mapping[str, str]
    since: float


@dataclass(frozen=True)
class ClearEbusy:
    """End our holders of the RDMA devices; then, if `retry`, relaunch at `retry_at`
    without spending a restart, else fail (waiting cannot free a device)."""

    failure: RankFailure
    retry: bool
    retry_at: float


@dataclass(frozen=True)
class Backoff:
    """Spend a restart: relaunch at `relaunch_at`, `delay` after the failure (stopping the
    gang took part of it already)."""

    cause: Cause
    delay: float
    relaunch_at: float


Decision = Fail | WaitNodes | ClearEbusy | Backoff


def asks_who_is_away(result: GangResult) -> bool:
    """Whether `decide` needs the nodes' answers: a spawn failure fails whoever answers."""
    return result.root.cause != Cause.SPAWN_FAILED


def decide(
    result: GangResult,
    away: Mapping[str, str] | None,
    policy: RestartPolicy,
    ebusy_retried: bool,
) -> Decision:
    """The recovery for `result`. away: the nodes that do not answer (node -> error; None
    when not asked, see asks_who_is_away); policy: read only; ebusy_retried: the one
    retry after EBUSY was spent since a gang was last ready."""
    failure, settings = result.root, policy.settings
    first = min(f.at for f in result.failures)  # the waits count from the first failure
    if failure.cause == Cause.SPAWN_FAILED:
        return Fail(
            f"{failure.summary()}; no restart can fix that: fix the node or cluster.toml, "
            "then `orchestrator restart`"
        )
    if away:
        return WaitNodes(away, first)
    if failure.cause == Cause.EBUSY:
        return ClearEbusy(failure, not ebusy_retried, first + settings.ebusy_cooldown_s)
    if policy.budget_exhausted():
        return Fail(
            f"more than {settings.max_restarts} restarts "
            f"within {settings.restart_window_s:g} s; last: {failure.summary()}"
        )
    delay = policy.upcoming_delay(failure.cause)
    return Backoff(failure.cause, delay, first + delay)
