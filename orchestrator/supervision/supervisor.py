"""Launches the gang, watches it, and restarts the whole gang when any part of it fails.

    launch ──▶ wait for rank 0 healthy ──▶ ready: watch exits, lost agents, progress
      ▲                                           │ first failure
      │                                           ▼
      │     stop every rank, confirm none left, root cause among the reports so far
      ├──── a node away: waiting, no restart spent ─────────── past node_wait_s ──┐
      │       (or serving on the nodes that remain, fewer_nodes.py)                 │
      ├──── ebusy: end our holders of the RDMA devices, one retry ── held by others ┤
      └──── else: backoff (+ cause cool-down) ───────────────── budget spent ───────┴─▶ failed

As in torch.distributed.elastic's agent, each gang's end comes back as a value (a
`GangResult`: every rank failure and the root cause), and `run()` returns a `RunResult`.
What follows a failure is decided in recovery.py; which gang launches next in
next_gang.py. A failed cluster keeps its 503s up until `orchestrator restart` (SIGHUP)
resets the budget, or a stop ends it. Readers outside the loop (gateway, `/status`) read
`view` (cluster_view.py). Nothing is shared: one supervisor per model instance.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from orchestrator.config import ClusterSpec
from orchestrator.launch.gang import Gang
from orchestrator.supervision import recovery
from orchestrator.supervision.cluster_view import SupervisorView
from orchestrator.supervision.failures import (
    Cause,
    GangResult,
    RankFailure,
    RunResult,
    classify_spawn,
    root_cause,
)
from orchestrator.supervision.fewer_nodes import FewerNodes, Shrink, adopted_shrink
from orchestrator.supervision.gang_stop import GangStopper, unwatch_links
from orchestrator.supervision.interfaces import Answers, Holders, Links, Probe
from orchestrator.supervision.metrics import OrchestratorMetrics
from orchestrator.supervision.monitor import GangMonitor
from orchestrator.supervision.next_gang import NextGang
from orchestrator.supervision.node_wait import NodeAnswers
from orchestrator.supervision.prelaunch import before_launch
from orchestrator.supervision.progress import ProgressWatch
from orchestrator.supervision.races import first_done
from orchestrator.supervision.rdma_holders import AgentHolders, end_our_holders
from orchestrator.supervision.restart_policy import RestartPolicy
from orchestrator.supervision.state import GangState, StateMachine
from orchestrator.supervision.waits import NODE_RETRY_S, Waits
from orchestrator.transports.pool import NodePool

log = logging.getLogger(__name__)

FAILED_GANG_GRACE_S = 1.0  # SIGTERM to SIGKILL for the ranks of a gang that already failed
WATCH_S = 1.0


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
        fewer_gang: Callable[[Shrink], Gang] | None = None,  # a gang on the nodes that remain
        # Awaited before the switch back to every node (the placement of every node, when
        # the gang adopted on fewer never had one).
        before_every_node: Callable[[], Awaitable[None]] | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.spec, self.pool, self.metrics, self.machine = spec, pool, metrics, machine
        self.monitor, self.probe, self.links = monitor, probe, links
        self.answers, self.holders = answers or NodeAnswers(pool), holders or AgentHolders(pool)
        self.waits = Waits(spec.supervisor.node_wait_s, machine, metrics, links, self.answers,
                           clock, lambda seconds: self._stop_within(self._sleep(seconds)))
        self.view = SupervisorView(machine, clock)  # what the gateway and status read
        self.fewer = FewerNodes(spec, fewer_gang, self.answers, sleep, NODE_RETRY_S)
        self.next = NextGang(self.fewer.gang_maker(new_gang), spec.supervisor.standby_ranks)
        self.stopper = GangStopper(self.answers, links, self.fewer.unwatch)
        self.fewer.on_change = self.next.drop_standby  # a standby of another shape is no use
        self._ebusy_retried = False  # the one retry after EBUSY, until a gang is ready
        self._on_launch, self._clock, self._sleep = on_launch, clock, sleep
        self._before_every_node = before_every_node or _nothing
        self.policy = RestartPolicy(spec.supervisor, clock)
        self._stop = asyncio.Event()
        self._restart = asyncio.Event()
        self._ready_since = 0.0
        self._force = self._keep_ranks = False
        machine.on_change(lambda old, new, reason: metrics.state.state(new.value))

    # ── requests from the operator ──

    def request_stop(self, force: bool = False, keep_ranks: bool = False) -> None:
        """End the run; force: SIGKILL at once; keep_ranks: they serve on, to be adopted."""
        self._force, self._keep_ranks = self._force or force, keep_ranks
        self._stop.set()

    def adopt(self, gang: Gang) -> None:  # serve this running gang first: no pre-launch checks
        self.next.adopt(gang)
        shrink = adopted_shrink(self.spec, gang.record) if gang.record else None
        if shrink is not None:  # it runs on fewer nodes: back to every node once they answer
            self.fewer.shrink(shrink)

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
                if result is None and self.fewer.back and not self._stop.is_set():
                    # The nodes away answer again: a planned switch back to every node.
                    self.machine.to(GangState.RESTARTING, self.fewer.back_reason)
                    await self._stop_gang()  # requests in flight finish; new ones are held
                    await self._before_every_node()
                    self.fewer.restore()
                elif result is None or not await self._recover(result):
                    break
        finally:
            await (unwatch_links(self.links) if self._keep_ranks else self._stop_gang())
            self.machine.to(GangState.STOPPED, "stop requested")
        history = self.view.history
        return RunResult(self.view.restarts, history[-1] if history else None)

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
            if self.view.history:
                self.metrics.recovery.observe(self._clock() - self.view.history[-1].root.at)
            self._ready_since = self._clock()
            self._ebusy_retried = False
            api, fewer = self.spec.api, self.fewer.current
            self.machine.to(GangState.READY, f"serving at http://{api.host}:{api.port}/v1"
                            + (f" {fewer.reason}" if fewer else ""))
            if self.links is not None and fewer is None:  # no probes to the nodes away
                await self.links.watch()
            failures = await self._first_of(self._watch_progress())
        if not failures or self._stop.is_set():
            return None
        if self.view.gang is not None:  # first, for the gateway's resends
            self.view.note_failure(self.view.gang.launch_id, root_cause(failures))
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
        spec = self.fewer.current.spec if self.fewer.current else self.spec
        links = self.waits.links if self.fewer.current is None else None  # none to nodes away
        stale = self.fewer.stale(self.view.gang)
        self.stopper.forget()
        failures = await before_launch(spec, self.pool, self.metrics, stale, self.next.adopting,
                                       links, self._clock)
        if failures is not None:
            return failures
        gang = self.view.gang = self.next.take()
        self.monitor.watch(gang)
        log.info("launching %d ranks, launch %s", spec.world_size, gang.launch_id)
        try:
            spawn_failures = await gang.start()
        finally:
            self._on_launch(gang)
        for rank in gang.ranks:
            self.metrics.rank_up.labels(rank=str(rank)).set(1 if gang.ranks[rank].running else 0)
        return [classify_spawn(failure, self._clock()) for failure in spawn_failures]

    async def _until_healthy(self) -> RankFailure | None:
        assert self.view.gang is not None
        timeout = self.spec.supervisor.launch_timeout_s
        gang = self.view.gang
        if await self.probe.healthy(gang.rank0_url, timeout, gang.plan.tls_cert):
            return None
        return RankFailure(Cause.INIT_TIMEOUT, self.view.gang.plan.ranks[0].node, 0,
                           f"rank 0 not healthy within {timeout:g} s", self._clock())

    async def _watch_progress(self) -> RankFailure | None:
        gang = self.view.gang
        assert gang is not None
        watch = self.view.progress = ProgressWatch(self.spec.supervisor.hang_timeout_s,
                                                   self._clock())
        self.fewer.watch_for_return()  # while serving on fewer nodes
        while not self.fewer.back:  # then a planned switch back to every node
            await self._sleep(WATCH_S)
            self.policy.note_ready(self._ready_since)
            sample = await self.probe.sample(gang.rank0_url, gang.plan.tls_cert)
            reason = watch.observe(sample, self._clock())
            if reason is not None:
                return RankFailure(Cause.HANG, gang.plan.ranks[0].node, 0, reason, self._clock())
            await self.next.start_standby_when_due(sample, self._clock() - self._ready_since)
        return None

    async def _first_of(self, watch: Awaitable[RankFailure | None]) -> list[RankFailure]:
        """Run `watch` until it finds a failure, an agent reports one, or a stop is
        requested; returns the failures found so far (none on a stop or a clean finish)."""
        watching = asyncio.ensure_future(watch)
        await first_done(watching, self.monitor.failed.wait(), self._stop.wait())
        found = watching.result() if watching.done() and not watching.cancelled() else None
        return ([found] if found else []) + self.monitor.take()

    async def _recover(self, result: GangResult) -> bool:
        """Carry out recovery.decide for a failed gang; False if the orchestrator should stop."""
        self.view.history.append(result)
        failure = result.root
        self.machine.to(GangState.RESTARTING, failure.summary())
        nodes = self.fewer.nodes(list(self.pool.nodes))
        away = await self.stopper.away(nodes) if recovery.asks_who_is_away(result) else None
        match recovery.decide(result, away, self.policy, self._ebusy_retried):
            case recovery.Fail(reason):
                return await self._wait_while_failed(reason)
            case recovery.WaitNodes(gone, since):
                decide = self.fewer.decider(self.pool.fingerprints)
                outcome = await self.waits.nodes(nodes, dict(gone), since, decide)
                if isinstance(outcome, str) and outcome:
                    return await self._wait_while_failed(outcome)
                if isinstance(outcome, Shrink):
                    self.fewer.shrink(outcome)  # the next launch: on the nodes that remain
                return outcome is not None
            case recovery.ClearEbusy(failure, retry, retry_at):
                # Our holders ended, standbys too (they carry JACCL's env), and one retry
                # without spending a restart; else failed, naming holders not ours.
                self.next.drop_standby()
                held = await end_our_holders(self.holders, list(self.pool.nodes),
                                               self.next.launch_ids, failure.summary(), retry)
                if held:
                    return await self._wait_while_failed(held)
                self._ebusy_retried = True
                wait = max(retry_at - self._clock(), 0.0)
                log.info("ebusy: retrying once in %.1f s (no restart spent)", wait)
                return not await self._stop_within(self._sleep(wait))
            case recovery.Backoff(cause, delay, relaunch_at):
                self.policy.record()
                self.view.restarts += 1
                self.metrics.restarts.labels(cause=cause.value).inc()
                self.metrics.restart_backoff.set(delay)
                wait = max(relaunch_at - self._clock(), 0.0)
                log.info("backoff %.1f s (restart %d, cause %s): relaunching in %.1f s",
                         delay, self.view.restarts, cause, wait)
                return not await self._stop_within(self._sleep(wait))

    async def _wait_while_failed(self, reason: str) -> bool:
        """Failed until `orchestrator restart` (True) or a stop request (False)."""
        self.machine.to(GangState.FAILED, reason)
        self._restart.clear()
        return not await self._stop_within(self._restart.wait())

    async def _stop_within(self, wait: Awaitable[object]) -> bool:
        """Wait for `wait` or a stop request; True if the stop came first."""
        await first_done(wait, self._stop.wait())
        return self._stop.is_set()

    async def _stop_gang(self, grace_s: float | None = None) -> None:
        gang = self.view.gang
        if gang is None:
            return
        grace_s = self.spec.supervisor.stop_grace_s if grace_s is None else grace_s
        await self.stopper.stop(gang, 0.0 if self._force else grace_s)
        for rank in gang.ranks:
            self.metrics.rank_up.labels(rank=str(rank)).set(0)


async def _nothing() -> None:
    return None
