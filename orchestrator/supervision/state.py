"""The cluster's one state machine.

    pending → connecting → preflight → launching → ready ⇄ restarting
                                          ▲    │                  │
                                          │    ▼                  │
                                          └─ waiting ◀────────────┘
    any of them ──▶ failed | stopped

`restarting` goes back to `launching`; `failed` can be reset to `launching` by
`orchestrator restart`. `waiting`: a node is unreachable (restarting → waiting) or a link
between ranks does not answer (launching → waiting); waiting spends no restart, and
the launch goes on once they answer. Every transition is logged and timestamped.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from enum import StrEnum

log = logging.getLogger(__name__)


class GangState(StrEnum):
    PENDING = "pending"
    CONNECTING = "connecting"
    PREFLIGHT = "preflight"
    LAUNCHING = "launching"
    READY = "ready"
    RESTARTING = "restarting"
    WAITING = "waiting"  # for a node or link to answer again
    FAILED = "failed"
    STOPPED = "stopped"


_ANY_TO_END = {GangState.FAILED, GangState.STOPPED}
ALLOWED: dict[GangState, set[GangState]] = {
    GangState.PENDING: {GangState.CONNECTING} | _ANY_TO_END,
    GangState.CONNECTING: {GangState.PREFLIGHT} | _ANY_TO_END,
    GangState.PREFLIGHT: {GangState.LAUNCHING} | _ANY_TO_END,
    GangState.LAUNCHING: {GangState.READY, GangState.RESTARTING, GangState.WAITING}
    | _ANY_TO_END,
    GangState.READY: {GangState.RESTARTING} | _ANY_TO_END,
    GangState.RESTARTING: {GangState.LAUNCHING, GangState.CONNECTING, GangState.WAITING}
    | _ANY_TO_END,
    GangState.WAITING: {GangState.LAUNCHING, GangState.RESTARTING} | _ANY_TO_END,
    GangState.FAILED: {GangState.LAUNCHING, GangState.CONNECTING, GangState.STOPPED},
    GangState.STOPPED: set(),
}


class InvalidTransition(RuntimeError):
    pass


class StateMachine:
    """Holds the current state and the reason for it; notifies listeners on change."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self.state = GangState.PENDING
        self.reason = ""
        self.since = clock()
        self._listeners: list[Callable[[GangState, GangState, str], None]] = []

    def on_change(self, listener: Callable[[GangState, GangState, str], None]) -> None:
        self._listeners.append(listener)

    def to(self, new: GangState, reason: str = "") -> None:
        old = self.state
        if new == old:
            self.reason = reason or self.reason
            return
        if new not in ALLOWED[old]:
            raise InvalidTransition(f"{old} -> {new}")
        self.state, self.reason, self.since = new, reason, self._clock()
        log.info("state %s -> %s%s", old, new, f": {reason}" if reason else "")
        for listener in self._listeners:
            listener(old, new, reason)

    @property
    def seconds_in_state(self) -> float:
        return self._clock() - self.since
