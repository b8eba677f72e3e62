"""What the gateway and `/status` read of one supervised cluster, and the two things the
gateway may ask of it: wait for a ready rank 0, wake the idle workers.

The supervision loop writes here (the current gang, its progress, the restarts and the
failures so far) and the state machine pulses it; readers get `Upstream`s and frozen
`SupervisorSnapshot`s, never the live objects. One per supervisor and nothing shared
between them, so several supervisors (one per model instance) can serve side by side in
one process, each gateway route reading its own view. It implements the gateway's
`orchestrator.gateway.view.ClusterView`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections import OrderedDict, deque
from collections.abc import Callable

from orchestrator.launch.gang import Gang
from orchestrator.supervision.failures import GangResult, RankFailure
from orchestrator.supervision.progress import ProgressWatch
from orchestrator.supervision.snapshot import SupervisorSnapshot, Upstream
from orchestrator.supervision.state import GangState, StateMachine

HISTORY = 20  # gang failures kept for status
WAKE_EVERY_S = 0.1  # the most often the gateway's requests wake the workers


class SupervisorView:
    def __init__(self, machine: StateMachine, clock: Callable[[], float]) -> None:
        self.machine, self._clock = machine, clock
        self.gang: Gang | None = None  # the gang launched last (ready or not)
        self.progress: ProgressWatch | None = None  # its rank 0's counters, once ready
        self.restarts = 0
        self.history: deque[GangResult] = deque(maxlen=HISTORY)
        self.draining = False  # shutdown began: no request will get a gang any more
        self._changed = asyncio.Event()
        self._woken_at = float("-inf")
        self._wakes: set[asyncio.Task[None]] = set()
        # Each failed launch's first classified failure, for the gateway's resend
        # (orchestrator/gateway/quarantine.py: a suspect or not).
        self._failures: OrderedDict[str, RankFailure] = OrderedDict()
        machine.on_change(lambda old, new, reason: self.pulse())

    @property
    def state(self) -> GangState:
        return self.machine.state

    @property
    def reason(self) -> str:
        return self.machine.reason

    def snapshot(self) -> SupervisorSnapshot:
        gang, progress = self.gang, self.progress
        return SupervisorSnapshot(
            state=self.state,
            reason=self.reason,
            launch_id=gang.launch_id if gang else "",
            ranks=tuple(dataclasses.replace(r) for r in gang.ranks.values()) if gang else (),
            restarts=self.restarts,
            last_failure=self.history[-1].root if self.history else None,
            history=tuple(self.history),
            serving=dataclasses.replace(progress.latest) if progress and progress.latest else None,
            tokens_per_second=progress.tokens_per_second if progress else 0.0,
        )

    async def wait_for_upstream(self, timeout_s: float, not_launch: str = "") -> Upstream | None:
        """Rank 0 of a ready gang (other than `not_launch`), or None if none within the timeout."""
        deadline = time.monotonic() + timeout_s
        while True:
            gang = self.gang
            if self.state == GangState.READY and gang and gang.launch_id != not_launch:
                return Upstream(gang.rank0_url, gang.launch_id, gang.plan.secret,
                                gang.plan.tls_cert)
            remaining = deadline - time.monotonic()
            ended = self.state in (GangState.FAILED, GangState.STOPPED) or self.draining
            if ended or remaining <= 0:
                return None
            try:
                await asyncio.wait_for(self._changed.wait(), remaining)
            except TimeoutError:
                return None

    def note_failure(self, launch_id: str, failure: RankFailure) -> None:
        """The supervisor found launch `launch_id` failed (before it leaves ready)."""
        self._failures[launch_id] = failure
        while len(self._failures) > HISTORY:
            self._failures.popitem(last=False)
        self.pulse()

    async def failure_of(self, launch_id: str, timeout_s: float) -> RankFailure | None:
        """Launch `launch_id`'s failure, waiting while it is still the ready gang (up to
        the timeout); None: no failure seen (stopped, shut down, or not found in time)."""
        deadline = time.monotonic() + timeout_s
        while launch_id not in self._failures:
            gang, remaining = self.gang, deadline - time.monotonic()
            serving = self.state == GangState.READY and gang and gang.launch_id == launch_id
            if not serving or self.draining or remaining <= 0:
                break
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), remaining)
        return self._failures.get(launch_id)

    def wake_workers(self) -> None:
        """A request is on its way to rank 0: end the workers' idle sleep now, so it does
        not wait up to keepalive_s for their next receive. Best effort, at most
        every WAKE_EVERY_S, in the background."""
        gang, now = self.gang, self._clock()
        if self.state != GangState.READY or gang is None or len(gang.ranks) < 2:
            return
        if now - self._woken_at < WAKE_EVERY_S:
            return
        self._woken_at = now
        task = asyncio.create_task(gang.wake_workers())
        self._wakes.add(task)
        task.add_done_callback(self._wakes.discard)

    def begin_drain(self) -> None:  # shutdown began: requests waiting get their 503 now
        self.draining = True
        self.pulse()

    def pulse(self) -> None:  # wake everything in wait_for_upstream to look again
        self._changed.set()
        self._changed = asyncio.Event()
