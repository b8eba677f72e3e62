"""When to relaunch after a failure, and when to give up.

Backoff doubles from `backoff_initial_s` to `backoff_max_s` per consecutive failure and
starts over once the gang has been ready for `backoff_reset_after_s`. More than
`max_restarts` restarts within `restart_window_s` exhausts the budget: the cluster is failed.
A cause's cool-down (EBUSY: RDMA resources need time to be released) adds to the backoff.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from orchestrator.config.spec import SupervisorSection
from orchestrator.supervision.failures import Cause


class RestartPolicy:
    def __init__(self, settings: SupervisorSection, clock: Callable[[], float]) -> None:
        self.settings = settings
        self._clock = clock
        self._restarts: deque[float] = deque()
        self._consecutive = 0

    def note_ready(self, ready_since: float) -> None:
        """Called while ready: a long enough healthy stretch forgets earlier failures."""
        if self._clock() - ready_since >= self.settings.backoff_reset_after_s:
            self._consecutive = 0

    def budget_exhausted(self) -> bool:
        """True when one more restart would exceed max_restarts within the window."""
        self._forget_old()
        return len(self._restarts) >= self.settings.max_restarts

    def upcoming_delay(self, cause: Cause) -> float:
        """How long the next restart would wait before relaunching (nothing recorded)."""
        s = self.settings
        backoff = min(s.backoff_initial_s * 2**self._consecutive, s.backoff_max_s)
        cooldown = s.ebusy_cooldown_s if cause == Cause.EBUSY else 0.0
        return backoff + cooldown

    def record(self) -> None:
        """A restart is spent now: it counts toward the budget and doubles the backoff."""
        self._forget_old()
        self._restarts.append(self._clock())
        self._consecutive += 1

    def next_delay(self, cause: Cause) -> float:
        """Record a restart and return how long to wait before relaunching."""
        delay = self.upcoming_delay(cause)
        self.record()
        return delay

    def reset(self) -> None:
        """`orchestrator restart`: the operator asks for a fresh budget."""
        self._restarts.clear()
        self._consecutive = 0

    @property
    def restarts_in_window(self) -> int:
        self._forget_old()
        return len(self._restarts)

    def _forget_old(self) -> None:
        horizon = self._clock() - self.settings.restart_window_s
        while self._restarts and self._restarts[0] < horizon:
            self._restarts.popleft()
