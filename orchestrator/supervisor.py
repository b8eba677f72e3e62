"""Launches the gang, watches it, and restarts the whole gang when any part of it fails.

    launch ──▶ wait for rank 0 healthy ──▶ ready: watch exits, lost agents, progress
       ▲                                          │ first failure
       │                                          ▼
    backoff (+ cause cool-down) ◀── stop every rank, confirm none left, ──▶ budget spent: failed
                                    root cause among the reports so far

A failed cluster keeps the orchestrator (and its 503s) up until `orchestrator restart`
(SIGHUP) resets the budget, or a stop request ends it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

import httpx

from node_agent.protocol import Event, Exited, Log
from orchestrator.config import ClusterSpec
from orchestrator.failures import Cause, RankFailure, classify_exit, root_cause
from orchestrator.gang import Gang, LaunchError
from orchestrator.gang_state import GangState, StateMachine
from orchestrator.gateway.cluster_view import Upstream
from orchestrator.health_probe import (
    ProgressWatch,
    ServingSample,
    sample_serving,
    wait_until_healthy,
)
from orchestrator.launch_plan import build_plan, new_launch_id
from orchestrator.metrics import OrchestratorMetrics
from orchestrator.nodes import NodePool
from orchestrator.restart_policy import RestartPolicy
from orchestrator.stale_ranks import end_stale_ranks
from orchestrator.status_model import ClusterStatus
from orchestrator.status_report import build_status
from orchestrator.transports import AgentExit

log = logging.getLogger(__name__)
rank_log = logging.getLogger("rank")

FAILED_GANG_GRACE_S = 1.0  # SIGTERM to SIGKILL for the ranks of a gang that already failed
WATCH_S = 1.0
# Standby ranks start once the gang has been ready this long and rank 0 has no request,
# so their start-up (seconds of CPU per node) does not slow the first requests; under
# constant load they start anyway after STANDBY_BUSY_AFTER_S.
STANDBY_AFTER_S = 3.0
STANDBY_BUSY_AFTER_S = 60.0


class Supervisor:
    def __init__(
        self,
        spec: ClusterSpec,
        pool: NodePool,
        metrics: OrchestratorMetrics,
        machine: StateMachine,
        http: httpx.AsyncClient,
        on_launch: Callable[[Gang], None] = lambda gang: None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.spec, self.pool, self.metrics, self.machine = spec, pool, metrics, machine
        self.http, self._on_launch, self._clock = http, on_launch, clock
        self.policy = RestartPolicy(spec.supervisor, clock)
        self.gang: Gang | None = None
        self._next_gang: Gang | None = None  # the next launch, its ranks started as standbys
        self.restarts = 0
        self.last_failure: RankFailure | None = None
        self.progress: ProgressWatch | None = None
        self._failures: asyncio.Queue[RankFailure] = asyncio.Queue()
        self._stop = asyncio.Event()
        self._restart = asyncio.Event()
        self._changed = asyncio.Event()
        self._ready_since = 0.0
        self._force = False
        self._draining = False
        machine.on_change(self._state_changed)

    # ── what the gateway sees (ClusterView) ──

    @property
    def state(self) -> GangState:
        return self.machine.state

    @property
    def reason(self) -> str:
        return self.machine.reason

    @property
    def draining(self) -> bool:
        return self._draining

    async def wait_for_upstream(self, timeout_s: float, not_launch: str = "") -> Upstream | None:
        deadline = self._clock() + timeout_s
        while True:
            gang = self.gang
            if self.state == GangState.READY and gang and gang.launch_id != not_launch:
                return Upstream(gang.plan.rank0_url, gang.launch_id)
            remaining = deadline - self._clock()
            ended = self.state in (GangState.FAILED, GangState.STOPPED) or self._draining
            if ended or remaining <= 0:
                return None
            changed = self._changed
            try:
                await asyncio.wait_for(changed.wait(), remaining)
            except TimeoutError:
                return None

    def status(self) -> ClusterStatus:
        return build_status(self)

    # ── requests from the operator ──

    def begin_drain(self) -> None:
        """Shutdown began: requests waiting for a gang get their answer (503) now."""
        self._draining = True
        self._pulse()

    def request_stop(self, force: bool = False) -> None:
        """End the run; with force, ranks get SIGKILL at once instead of a grace period."""
        self._force = self._force or force
        self._stop.set()

    def request_restart(self) -> None:
        """`orchestrator restart` / SIGHUP: a fresh restart budget, and a relaunch if failed."""
        self.policy.reset()
        self._restart.set()

    # ── events from the agents ──

    def on_agent_event(self, node: str, event: Event) -> None:
        if isinstance(event, Log):
            rank_log.info("[%s r%d] %s", node, event.rank, event.line)
        elif isinstance(event, Exited):
            self._on_exit(node, event)

    def on_agent_lost(self, node: str, exit_info: AgentExit) -> None:
        self.metrics.node_up.labels(node=node).set(0)
        if self.gang is not None and any(
            p.node == node and p.running for p in self.gang.ranks.values()
        ):
            self._fail(RankFailure(Cause.AGENT_LOST, node, None, exit_info.reason, self._clock()))

    def _on_exit(self, node: str, exited: Exited) -> None:
        process = self.gang.note_exit(exited) if self.gang else None
        if process is None:
            return
        self.metrics.rank_up.labels(rank=str(exited.rank)).set(0)
        if not exited.stopped:
            self._fail(
                classify_exit(exited, node, self._clock(), memory_pressure=self._low_memory(node))
            )

    def _low_memory(self, node: str) -> bool:
        fingerprint = self.pool.nodes[node].fingerprint
        memory = fingerprint.memory if fingerprint else None
        return bool(
            memory
            and memory.available_bytes is not None
            and memory.available_bytes < 0.05 * memory.total_bytes
        )

    def _fail(self, failure: RankFailure) -> None:
        log.warning("failure: %s", failure.summary())
        self._failures.put_nowait(failure)

    # ── the loop ──

    async def run(self) -> None:
        """Serve until a stop request; returns with every rank stopped."""
        try:
            while not self._stop.is_set():
                failure = await self._launch_and_serve()
                if failure is None or not await self._recover(failure):
                    break
        finally:
            await self._stop_gang()
            self.machine.to(GangState.STOPPED, "stop requested")

    async def _launch_and_serve(self) -> RankFailure | None:
        self.machine.to(GangState.LAUNCHING)
        started = self._clock()
        failure = await self._launch()
        if failure is None:
            failure = await self._first_of(self._until_healthy(), self._failures.get())
        if failure is not None or self._stop.is_set():
            return failure
        self.metrics.launch_duration.observe(self._clock() - started)
        if self.last_failure is not None:
            self.metrics.recovery.observe(self._clock() - self.last_failure.at)
        self._ready_since = self._clock()
        self.machine.to(
            GangState.READY, f"serving at http://{self.spec.api.host}:{self.spec.api.port}/v1"
        )
        return await self._first_of(self._watch_progress(), self._failures.get())

    async def _launch(self) -> RankFailure | None:
        errors = await self.pool.connect_all()
        for name, node in self.pool.nodes.items():
            self.metrics.node_up.labels(node=name).set(1 if node.connected else 0)
        for error in errors:
            return RankFailure(Cause.AGENT_LOST, error.node, None, error.message, self._clock())
        if self.gang is not None:
            await end_stale_ranks(self.pool, self.gang.unconfirmed())
        self._drain_failures()
        self.gang = self._next_gang or self._new_gang()
        self._next_gang = None
        log.info("launching %d ranks, launch %s", self.spec.world_size, self.gang.launch_id)
        try:
            await self.gang.start()
        except LaunchError as exc:
            return RankFailure(Cause.RANK_CRASHED, "?", None, str(exc), self._clock())
        finally:
            self._on_launch(self.gang)
        for rank in self.gang.ranks:
            self.metrics.rank_up.labels(rank=str(rank)).set(1)
        return None

    def _new_gang(self) -> Gang:
        return Gang(build_plan(self.spec, new_launch_id()), self.pool)

    async def _start_standby_when_due(self, sample: ServingSample | None) -> None:
        """Start the next launch's ranks as standbys, once per gang, when due (see above)."""
        if not self.spec.supervisor.standby_ranks or self._next_gang is not None:
            return
        ready_for = self._clock() - self._ready_since
        idle = sample is not None and sample.running == 0 and sample.waiting == 0
        if (idle and ready_for >= STANDBY_AFTER_S) or ready_for >= STANDBY_BUSY_AFTER_S:
            self._next_gang = self._new_gang()
            await self._next_gang.start_standby()

    async def _until_healthy(self) -> RankFailure | None:
        assert self.gang is not None
        timeout = self.spec.supervisor.launch_timeout_s
        if await wait_until_healthy(self.http, self.gang.plan.rank0_url, timeout):
            return None
        return RankFailure(
            Cause.INIT_TIMEOUT,
            self.spec.nodes[0].name,
            0,
            f"rank 0 not healthy within {timeout:g} s",
            self._clock(),
        )

    async def _watch_progress(self) -> RankFailure | None:
        assert self.gang is not None
        watch = self.progress = ProgressWatch(self.spec.supervisor.hang_timeout_s, self._clock())
        while True:
            await asyncio.sleep(WATCH_S)
            self.policy.note_ready(self._ready_since)
            sample = await sample_serving(self.http, self.gang.plan.rank0_url)
            reason = watch.observe(sample, self._clock())
            if reason is not None:
                return RankFailure(Cause.HANG, self.spec.nodes[0].name, 0, reason, self._clock())
            await self._start_standby_when_due(sample)

    async def _first_of(self, *waits: Awaitable[object]) -> RankFailure | None:
        """The first failure among the given waits; None on a stop request or a clean finish."""
        tasks = [asyncio.ensure_future(w) for w in waits]
        tasks.append(asyncio.ensure_future(self._stop.wait()))
        try:
            done, _pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in tasks:
                task.cancel()
        results = [r for r in (task.result() for task in done) if isinstance(r, RankFailure)]
        if not results or self._stop.is_set():
            return None
        return results[0]

    def _root_cause(self, first: RankFailure) -> RankFailure:
        """Among the first failure and its echoes (collected while the gang stopped)."""
        failures = [first, *self._drain_failures()]
        root = root_cause(failures)
        for echo in failures:
            if echo is not root:
                log.info("consequence of %s: %s", root.cause, echo.summary())
        return root

    def _drain_failures(self) -> list[RankFailure]:
        drained = []
        while not self._failures.empty():
            drained.append(self._failures.get_nowait())
        return drained

    async def _recover(self, first: RankFailure) -> bool:
        """Stop the gang, then wait out the backoff; False if the orchestrator should stop."""
        self.machine.to(GangState.RESTARTING, first.summary())
        # A gang that lost a rank has nothing left to drain: a short grace, then SIGKILL.
        # Its other ranks' reports (peer_lost echoes) arrive while it stops.
        await self._stop_gang(FAILED_GANG_GRACE_S)
        failure = self.last_failure = self._root_cause(first)
        self.machine.to(GangState.RESTARTING, failure.summary())
        if self.policy.budget_exhausted():
            return await self._wait_while_failed(failure)
        delay = self.policy.next_delay(failure.cause)
        self.restarts += 1
        self.metrics.restarts.labels(cause=failure.cause.value).inc()
        self.metrics.restart_backoff.set(delay)
        # The backoff counts from the failure: stopping the gang took part of it already.
        wait = max(delay - (self._clock() - first.at), 0.0)
        log.info("backoff %.1f s (restart %d, cause %s): relaunching in %.1f s",
                 delay, self.restarts, failure.cause, wait)
        return not await self._interruptible_sleep(wait)

    async def _wait_while_failed(self, failure: RankFailure) -> bool:
        window = self.spec.supervisor.restart_window_s
        hint = (
            " (EBUSY that persists usually needs a reboot of the nodes)"
            if failure.cause == Cause.EBUSY
            else ""
        )
        self.machine.to(
            GangState.FAILED,
            f"more than {self.spec.supervisor.max_restarts} restarts "
            f"within {window:g} s; last: {failure.summary()}{hint}",
        )
        self._restart.clear()
        await self._first_of(self._restart.wait())
        return not self._stop.is_set()

    async def _interruptible_sleep(self, seconds: float) -> bool:
        """Sleep; True if a stop request came first."""
        try:
            await asyncio.wait_for(self._stop.wait(), seconds)
        except TimeoutError:
            return False
        return True

    async def _stop_gang(self, grace_s: float | None = None) -> None:
        gang = self.gang
        if gang is None:
            return
        if grace_s is None:
            grace_s = self.spec.supervisor.stop_grace_s
        await gang.stop(0.0 if self._force else grace_s)
        leftovers = await gang.leftovers()
        if leftovers:
            log.error("ranks still running after stop: %s; killing", ", ".join(leftovers))
            await gang.stop(0.0)
        for rank in gang.ranks:
            self.metrics.rank_up.labels(rank=str(rank)).set(0)

    def _state_changed(self, old: GangState, new: GangState, reason: str) -> None:
        self.metrics.state.state(new.value)
        self._pulse()

    def _pulse(self) -> None:
        """Wake everything waiting in wait_for_upstream to look again."""
        self._changed.set()
        self._changed = asyncio.Event()
