"""Launches the gang, watches it, and restarts the whole gang when any part of it fails.

    launch ──▶ wait for rank 0 healthy ──▶ ready: watch exits, lost agents, progress
      ▲                                           │ first failure
      │                                           ▼
      │     stop every rank, confirm none left, root cause among the reports so far
      ├──── a node away: waiting, no restart spent ─────────── past node_wait_s ──┐
      ├──── ebusy: end our holders of the RDMA devices, one retry ── held by others ┤
      └──── else: backoff (+ cause cool-down) ───────────────── budget spent ───────┴─▶ failed

As in torch.distributed.elastic's agent, each gang's end comes back as a value (a
`GangResult`: every rank failure and the root cause), and `run()` returns a `RunResult`.
A failed cluster keeps the orchestrator (and its 503s) up until `orchestrator restart`
(SIGHUP) resets the budget, or a stop request ends it. Readers outside the loop (the
gateway, `/status`) see a `SupervisorSnapshot`, never the live objects.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable

from orchestrator.config import ClusterSpec
from orchestrator.launch.gang import Gang
from orchestrator.launch.stale_ranks import end_stale_ranks
from orchestrator.supervision.failures import Cause, GangResult, RankFailure, RunResult
from orchestrator.supervision.gang_stop import STOP_ANSWER_S, stop_gang
from orchestrator.supervision.interfaces import Answers, Holders, Links, Probe
from orchestrator.supervision.metrics import OrchestratorMetrics
from orchestrator.supervision.monitor import GangMonitor
from orchestrator.supervision.node_wait import NodeAnswers
from orchestrator.supervision.progress import ProgressWatch, ServingSample
from orchestrator.supervision.rdma_devices import rdma_device_problems
from orchestrator.supervision.rdma_holders import AgentHolders, end_our_holders, failed_reason
from orchestrator.supervision.restart_policy import RestartPolicy
from orchestrator.supervision.snapshot import SupervisorSnapshot, Upstream
from orchestrator.supervision.state import GangState, StateMachine
from orchestrator.supervision.waits import Waits
from orchestrator.transports.pool import NodePool

log = logging.getLogger(__name__)

FAILED_GANG_GRACE_S = 1.0  # SIGTERM to SIGKILL for the ranks of a gang that already failed
WATCH_S = 1.0
HISTORY = 20  # gang failures kept for status
# Standby ranks start once the gang has been ready this long and rank 0 has no request,
# so their start-up (seconds of CPU per node) does not slow the first requests; under
# constant load they start anyway after STANDBY_BUSY_AFTER_S.
STANDBY_AFTER_S = 3.0
STANDBY_BUSY_AFTER_S = 60.0
WAKE_EVERY_S = 0.1  # the most often the gateway's requests wake the workers


class Supervisor:
    def __init__(
        self,
        spec: ClusterSpec,
        pool: NodePool,
        metrics: OrchestratorMetrics,
        machine: StateMachine,
        monitor: GangMonitor,
        probe: Probe,
        new_gang: Callable[[], Gang],
        *,
        links: Links | None = None,
        answers: Answers | None = None,
        holders: Holders | None = None,
        on_launch: Callable[[Gang], None] = lambda gang: None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.spec, self.pool, self.metrics, self.machine = spec, pool, metrics, machine
        self.monitor, self.probe, self._new_gang = monitor, probe, new_gang
        self.links = links
        self.answers, self.holders = answers or NodeAnswers(pool), holders or AgentHolders(pool)
        self.waits = Waits(spec.supervisor.node_wait_s, machine, metrics, links, self.answers,
                           clock, lambda seconds: self._stop_within(self._sleep(seconds)))
        self._launch_ids: set[str] = set()  # every launch of this run: its ranks are ours
        self._ebusy_retried = False  # the one retry after EBUSY, until a gang is ready
        self._on_launch, self._clock, self._sleep = on_launch, clock, sleep
        self.policy = RestartPolicy(spec.supervisor, clock)
        self.gang: Gang | None = None
        self._next_gang: Gang | None = None  # the next launch, its ranks started as standbys
        self._adopted: Gang | None = None  # a previous run's gang, to serve on first
        self.restarts = 0
        self.history: deque[GangResult] = deque(maxlen=HISTORY)
        self.progress: ProgressWatch | None = None
        self._stop = asyncio.Event()
        self._restart = asyncio.Event()
        self._changed = asyncio.Event()
        self._ready_since = 0.0
        self._force = self._keep_ranks = False
        self._woken_at = float("-inf")
        self._wakes: set[asyncio.Task[None]] = set()
        self.draining = False
        machine.on_change(self._state_changed)

    # ── what the gateway and status read ──

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
                return Upstream(gang.rank0_url, gang.launch_id, gang.plan.secret)
            remaining = deadline - time.monotonic()
            ended = self.state in (GangState.FAILED, GangState.STOPPED) or self.draining
            if ended or remaining <= 0:
                return None
            try:
                await asyncio.wait_for(self._changed.wait(), remaining)
            except TimeoutError:
                return None

    def wake_workers(self) -> None:
        """A request is on its way to rank 0: end the workers' idle sleep now, so it does
        not wait up to 90% of keepalive_s for their next receive. Best effort, at most
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

    # ── requests from the operator ──

    def begin_drain(self) -> None:  # shutdown began: requests waiting get their 503 now
        self.draining = True
        self._pulse()

    def request_stop(self, force: bool = False, keep_ranks: bool = False) -> None:
        """End the run; force: SIGKILL at once; keep_ranks: they serve on, to be adopted."""
        self._force, self._keep_ranks = self._force or force, keep_ranks
        self._stop.set()

    def adopt(self, gang: Gang) -> None:  # serve this running gang first: no pre-launch checks
        self._adopted = gang

    def request_restart(self) -> None:
        """`orchestrator restart` / SIGHUP: a fresh restart budget, and a relaunch if failed."""
        self.policy.reset()
        self._restart.set()

    # ── the loop ──

    async def run(self) -> RunResult:
        """Serve until a stop request; returns with every rank stopped."""
        try:
            while not self._stop.is_set():
                result = await self._launch_and_serve()
                if result is None or not await self._recover(result):
                    break
        finally:
            await (self._unwatch() if self._keep_ranks else self._stop_gang())
            self.machine.to(GangState.STOPPED, "stop requested")
        return RunResult(self.restarts, self.history[-1] if self.history else None)

    async def _launch_and_serve(self) -> GangResult | None:
        """Launch a gang and serve until it fails (its result, taken once it is stopped)
        or a stop is requested (None)."""
        self.machine.to(GangState.LAUNCHING)
        started = self._clock()
        failures = await self._launch()
        if self._stop.is_set():
            return None
        if not failures:
            failures = await self._first_of(self._until_healthy())
        if not failures and not self._stop.is_set():
            self.metrics.launch_duration.observe(self._clock() - started)
            if self.history:
                self.metrics.recovery.observe(self._clock() - self.history[-1].root.at)
            self._ready_since = self._clock()
            self._ebusy_retried = False
            self.machine.to(
                GangState.READY, f"serving at http://{self.spec.api.host}:{self.spec.api.port}/v1"
            )
            if self.links is not None:
                await self.links.watch()
            failures = await self._first_of(self._watch_progress())
        if not failures or self._stop.is_set():
            return None
        self.machine.to(GangState.RESTARTING, failures[0].summary())
        # A gang that lost a rank has nothing left to drain: a short grace, then SIGKILL.
        # Its other ranks' reports (peer_lost echoes) arrive while it stops.
        await self._stop_gang(FAILED_GANG_GRACE_S)
        result = GangResult.of(failures + self.monitor.take())
        for echo in result.failures:
            if echo is not result.root:
                log.info("consequence of %s: %s", result.root.cause, echo.summary())
        return result

    async def _launch(self) -> list[RankFailure]:
        errors = await self.pool.connect_all()
        for name, node in self.pool.nodes.items():
            self.metrics.node_up.labels(node=name).set(1 if node.connected else 0)
        if errors:
            return [
                RankFailure(Cause.AGENT_LOST, error.node, None, error.message, self._clock())
                for error in errors
            ]
        if self.gang is not None:
            await end_stale_ranks(self.pool, self.gang.unconfirmed())
        if self._adopted is None:  # an adopted gang holds its ports and devices already
            devices = await rdma_device_problems(self.spec, self.pool, self._clock())
            if devices:
                return devices
            lost = await self.waits.links()
            if lost is None or lost:
                return lost or []  # nodes lost meanwhile; none when a stop request came
        gang = self.gang = self._adopted or self._next_gang or self._new_gang()
        self._next_gang = self._adopted = None
        self._launch_ids.add(gang.launch_id)
        self.monitor.watch(gang)
        log.info("launching %d ranks, launch %s", self.spec.world_size, gang.launch_id)
        try:
            spawn_failures = await gang.start()
        finally:
            self._on_launch(gang)
        for rank in gang.ranks:
            self.metrics.rank_up.labels(rank=str(rank)).set(1 if gang.ranks[rank].running else 0)
        return [
            RankFailure(Cause.SPAWN_FAILED if f.permanent else Cause.AGENT_LOST, f.node, f.rank,
                        f"cannot start the rank: {f.message}", self._clock())
            for f in spawn_failures
        ]

    async def _start_standby_when_due(self, sample: ServingSample | None) -> None:
        """Start the next launch's ranks as standbys, once per gang, when due (see above)."""
        if not self.spec.supervisor.standby_ranks or self._next_gang is not None:
            return
        ready_for = self._clock() - self._ready_since
        idle = sample is not None and sample.running == 0 and sample.waiting == 0
        if (idle and ready_for >= STANDBY_AFTER_S) or ready_for >= STANDBY_BUSY_AFTER_S:
            self._next_gang = self._new_gang()
            self._launch_ids.add(self._next_gang.launch_id)
            await self._next_gang.start_standby()

    async def _until_healthy(self) -> RankFailure | None:
        assert self.gang is not None
        timeout = self.spec.supervisor.launch_timeout_s
        if await self.probe.healthy(self.gang.rank0_url, timeout):
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
            await self._sleep(WATCH_S)
            self.policy.note_ready(self._ready_since)
            sample = await self.probe.sample(self.gang.rank0_url)
            reason = watch.observe(sample, self._clock())
            if reason is not None:
                return RankFailure(Cause.HANG, self.spec.nodes[0].name, 0, reason, self._clock())
            await self._start_standby_when_due(sample)

    async def _first_of(self, watch: Awaitable[RankFailure | None]) -> list[RankFailure]:
        """Run `watch` until it finds a failure, an agent reports one, or a stop is
        requested; returns the failures found so far (none on a stop or a clean finish)."""
        watching = asyncio.ensure_future(watch)
        waits = [
            asyncio.ensure_future(self.monitor.failed.wait()),
            asyncio.ensure_future(self._stop.wait()),
        ]
        try:
            await asyncio.wait([watching, *waits], return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (watching, *waits):
                task.cancel()
        found = watching.result() if watching.done() and not watching.cancelled() else None
        return ([found] if found else []) + self.monitor.take()

    async def _recover(self, result: GangResult) -> bool:
        """Wait out the backoff after a failed gang; False if the orchestrator should stop."""
        self.history.append(result)
        failure = result.root
        self.machine.to(GangState.RESTARTING, failure.summary())
        if failure.cause == Cause.SPAWN_FAILED:
            return await self._wait_while_failed(
                f"{failure.summary()}; no restart can fix that: fix the node or cluster.toml, "
                "then `orchestrator restart`"
            )
        away = await self.answers.away(list(self.pool.nodes))
        if away:
            since = min(f.at for f in result.failures)
            outcome = await self.waits.nodes(list(self.pool.nodes), away, since)
            if outcome is None:
                return False
            return await self._wait_while_failed(outcome) if outcome else True
        if failure.cause == Cause.EBUSY:
            return await self._clear_ebusy(failure, min(f.at for f in result.failures))
        if self.policy.budget_exhausted():
            window = self.spec.supervisor.restart_window_s
            return await self._wait_while_failed(
                f"more than {self.spec.supervisor.max_restarts} restarts "
                f"within {window:g} s; last: {failure.summary()}"
            )
        delay = self.policy.next_delay(failure.cause)
        self.restarts += 1
        self.metrics.restarts.labels(cause=failure.cause.value).inc()
        self.metrics.restart_backoff.set(delay)
        # The backoff counts from the failure: stopping the gang took part of it already.
        first = min(f.at for f in result.failures)
        wait = max(delay - (self._clock() - first), 0.0)
        log.info("backoff %.1f s (restart %d, cause %s): relaunching in %.1f s",
                 delay, self.restarts, failure.cause, wait)
        return not await self._stop_within(self._sleep(wait))

    async def _clear_ebusy(self, failure: RankFailure, first: float) -> bool:
        """EBUSY: end the RDMA devices' holders that are ours and retry once, after the
        cool-down and without spending a restart; fail naming the holders that are not
        ours, or when the retry meets EBUSY again (waiting cannot free a device)."""
        self._next_gang = None  # its standbys carry JACCL's env too: ended with the rest
        nodes = list(self.pool.nodes)
        reason = await end_our_holders(self.holders, nodes, self._launch_ids, failure.summary())
        if reason or self._ebusy_retried:
            return await self._wait_while_failed(reason or failed_reason(failure.summary()))
        self._ebusy_retried = True
        # Counted from the failure, as the backoff is: stopping the gang took part of it.
        wait = max(self.spec.supervisor.ebusy_cooldown_s - (self._clock() - first), 0.0)
        log.info("ebusy: retrying once in %.1f s (no restart spent)", wait)
        return not await self._stop_within(self._sleep(wait))

    async def _wait_while_failed(self, reason: str) -> bool:
        """Failed until `orchestrator restart` (True) or a stop request (False)."""
        self.machine.to(GangState.FAILED, reason)
        self._restart.clear()
        return not await self._stop_within(self._restart.wait())

    async def _stop_within(self, wait: Awaitable[object]) -> bool:
        """Wait for `wait` or a stop request; True if the stop came first."""
        task = asyncio.ensure_future(wait)
        stop = asyncio.ensure_future(self._stop.wait())
        try:
            await asyncio.wait([task, stop], return_when=asyncio.FIRST_COMPLETED)
        finally:
            task.cancel()
            stop.cancel()
        return self._stop.is_set()

    async def _stop_gang(self, grace_s: float | None = None) -> None:
        gang = self.gang
        if gang is None:
            return
        if grace_s is None:
            grace_s = self.spec.supervisor.stop_grace_s
        await asyncio.gather(stop_gang(gang, 0.0 if self._force else grace_s), self._unwatch())
        for rank in gang.ranks:
            self.metrics.rank_up.labels(rank=str(rank)).set(0)

    async def _unwatch(self) -> None:  # end the link probes; a node away does not hold it up
        if self.links is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.links.unwatch(), STOP_ANSWER_S)

    def _state_changed(self, old: GangState, new: GangState, reason: str) -> None:
        self.metrics.state.state(new.value)
        self._pulse()

    def _pulse(self) -> None:  # wake everything in wait_for_upstream to look again
        self._changed.set()
        self._changed = asyncio.Event()
