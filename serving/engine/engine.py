"""Rank 0's engine thread: admits requests, broadcasts StepPlans, steps the batch, streams text.

HTTP handlers only call submit() and cancel(); everything touching MLX happens here.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

from contract.exit_codes import RankExit
from contract.openai_errors import SHUTDOWN, TIMEOUT
from serving.engine.arrivals import arrival_window_s, gather
from serving.engine.batch import MirroredBatch, TokenEvent, digest_ints
from serving.engine.kv_budget import BeyondBudget
from serving.engine.prefill_pacing import PrefillPacer
from serving.engine.requests import Failed, GenerationRequest
from serving.engine.running import RunningRequest
from serving.engine.speculative import Speculator, known_tokens
from serving.engine.step_plan import Insert, PlanChannel, PlanKind, StepPlan
from serving.faults import FaultPlan
from serving.metrics import ServingMetrics

log = logging.getLogger(__name__)


class QueueFull(Exception):
    """The waiting queue is at its limit (HTTP 429)."""


class EngineStopping(Exception):
    """The engine no longer accepts requests (HTTP 503)."""


@dataclass(frozen=True)
class PlannedStep:
    plan: StepPlan
    admitted: list[GenerationRequest]  # the requests behind plan.inserts, in order
    payload: bytes  # the plan's inserts and removes, broadcast at the start of its step


class Engine:
    """Continuous batching on rank 0, mirrored by the workers through StepPlans."""

    def __init__(
        self,
        batch: MirroredBatch,
        channel: PlanChannel | None,
        tokenizer: object,
        *,
        max_batch_size: int,
        queue_limit: int,
        keepalive_s: float,
        faults: FaultPlan,
        metrics: ServingMetrics,
        pacer: PrefillPacer,
        comm_profile: bool = False,
        speculator: Speculator | None = None,
    ) -> None:
        self._batch = batch
        self._pacer = pacer
        self._channel = channel  # None at world size 1
        self._tokenizer = tokenizer
        self._max_batch = max_batch_size
        self._queue_limit = queue_limit
        self._keepalive_s = keepalive_s
        self._faults = faults
        self._metrics = metrics
        self._comm_profile = comm_profile
        self._spec = speculator  # None: speculative decoding off
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._waiting: collections.deque[GenerationRequest] = collections.deque()
        self._cancelled: set[str] = set()
        self._running: dict[int, RunningRequest] = {}  # by BatchGenerator uid
        self._removes: list[int] = []
        self._stop_deadline: float | None = None
        self._step_id = 0  # of the latest plan sent
        self._planned: PlannedStep | None = None  # sent to the workers, not yet run
        self._fingerprint = batch.fingerprint()  # after the latest applied plan
        self._last_digest = 0  # of the tokens of step _last_step_done
        self._last_step_done = 0
        metrics.pending.set_function(lambda: self.pending)
        metrics.prefix_cache_bytes.set_function(lambda: batch.prompt_cache_bytes)
        self._show_kv()

    # -- called from the event loop -------------------------------------------------
    def submit(self, request: GenerationRequest) -> None:
        with self._lock:
            if self._stop_deadline is not None:
                raise EngineStopping("server is shutting down")
            kv = self._batch.kv
            if kv is not None and (why := kv.refusal(len(request.prompt),
                                                     request.params.max_tokens)):
                raise BeyondBudget(why)
            if self._queue_full():
                raise QueueFull(f"{len(self._waiting)} requests already waiting")
            self._waiting.append(request)
            self._metrics.requests_waiting.set(len(self._waiting))
        self._wake.set()

    @property
    def queue_limit(self) -> int:
        return self._queue_limit

    def queue_is_full(self) -> bool:
        """Whether submit() would refuse now: checked before a prompt is tokenized."""
        with self._lock:
            return self._queue_full()

    def _queue_full(self) -> bool:
        """The waiting requests that a free batch slot takes at the next plan are not queued:
        two sent together to an idle rank with one slot and `queue_limit` 1 both get in."""
        free_slots = max(0, self._max_batch - len(self._running))
        return len(self._waiting) - free_slots >= self._queue_limit

    def cancel(self, request_id: str) -> None:
        with self._lock:
            self._cancelled.add(request_id)
        self._wake.set()

    def begin_stop(self, grace_s: float) -> None:
        """Stop accepting; in-flight requests get up to grace_s to finish."""
        with self._lock:
            if self._stop_deadline is None:
                self._stop_deadline = time.monotonic() + grace_s
        self._wake.set()

    @property
    def pending(self) -> int:
        return len(self._waiting) + len(self._running)

    # -- the engine thread ----------------------------------------------------------
    def run(self) -> RankExit:
        """Loop until stopped; returns the exit code (collective errors propagate).

        While busy, the plan for step s+1 goes out before step s's forward pass (the
        workers receive it while step s computes), so a request arriving during step s
        joins at step s+2. A plan that finds the engine idle goes out just before its
        own step, and a busy spell ends with a PAUSE: every header rank 0 queues is
        matched by the receive the workers queued at the same point.
        """
        while True:
            self._reap()
            if self._planned is None:
                if self._stopping_done():
                    break
                admitted = self._admit()
                if not (self._running or admitted or self._removes):
                    self._idle()
                    continue
                self._planned = self._plan(admitted)
            self._step(self._planned)
        self.fail_all("server is shutting down", SHUTDOWN)
        if self._channel is not None:
            self._channel.send(StepPlan(PlanKind.SHUTDOWN))
        return RankExit.OK

    def _stopping_done(self) -> bool:
        deadline = self._stop_deadline
        if deadline is None:
            return False
        return not (self._running and time.monotonic() < deadline)

    def _busy_after_this_step(self) -> bool:
        """Plan the next step now (ahead of this one), or end the busy spell with a PAUSE."""
        if self._stop_deadline is not None:
            return not self._stopping_done()
        return bool(self._running or self._removes or self._waiting)

    def _idle(self) -> None:
        """Nothing to do: wait for work; every keepalive interval prove the peers are alive."""
        self._metrics.batch_size.set(0)
        if self._wake.wait(self._keepalive_s):
            self._wake.clear()
            return
        if self._channel is not None and self._stop_deadline is None:
            self._channel.send(StepPlan(PlanKind.KEEPALIVE))
        # A keepalive is an empty step: the watchdog sees the engine (and collectives) move.
        self._metrics.last_step.set(time.time())

    def _reap(self) -> None:
        """Turn cancellations, timeouts and stop-string finishes into removes."""
        now = time.monotonic()
        planned = {r.request_id for r in self._planned.admitted} if self._planned else set()
        with self._lock:
            cancelled, self._cancelled = self._cancelled, set()
            # Admitted into the plan sent ahead but not applied yet: cancel it next time.
            self._cancelled = cancelled & planned
            expired = [r for r in self._waiting if r.deadline <= now]
            kept = [
                r for r in self._waiting
                if r.request_id not in cancelled and r.deadline > now
            ]
            self._waiting = collections.deque(kept)
            self._metrics.requests_waiting.set(len(self._waiting))
        for request in expired:
            request.sink.push(Failed("request timed out while waiting", TIMEOUT))
        for uid, running in list(self._running.items()):
            if running.request.request_id in cancelled:
                self._drop(uid, "cancelled")
            elif running.request.deadline <= now:
                running.request.sink.push(Failed("request timed out", TIMEOUT))
                self._drop(uid, "timeout")
            elif running.done:
                self._drop(uid, None)

    def _drop(self, uid: int, reason: str | None) -> None:
        self._running.pop(uid, None)
        self._removes.append(uid)
        if reason:
            log.info("removing uid %d (%s)", uid, reason)

    def _admit(self) -> list[GenerationRequest]:
        if self._stop_deadline is not None:
            return []
        self._gather_arrivals()
        admitted: list[GenerationRequest] = []
        needs = [r.request.kv_tokens for r in self._running.values()]
        with self._lock:
            while self._waiting and len(self._running) + len(admitted) < self._max_batch:
                # First come, first served: the head waits until its KV fits beside the rest.
                if not self._kv_fits([*needs, self._waiting[0].kv_tokens]):
                    break
                admitted.append(self._waiting.popleft())
                needs.append(admitted[-1].kv_tokens)
            self._metrics.requests_waiting.set(len(self._waiting))
        now = time.monotonic()
        for request in admitted:
            self._metrics.queue_time.observe(now - request.created)
        return admitted

    def _kv_fits(self, needs: list[int]) -> bool:
        return self._batch.kv is None or self._batch.kv.fits(needs)

    def _gather_arrivals(self) -> None:
        """Let the requests the API is still handing over join this plan too."""
        with self._lock:
            loop = self._waiting[0].sink.loop if self._waiting else None
        if loop is not None:
            window = 0.0 if self._running else arrival_window_s(self._pacer.decode_step_s)
            gather(lambda: len(self._waiting), self._room, loop, window_s=window)

    def _room(self) -> int:
        return self._max_batch - len(self._running)

    def _plan(self, admitted: list[GenerationRequest]) -> PlannedStep:
        """Number the next step, take the pending removes, and broadcast its plan."""
        self._step_id += 1
        inserts = [Insert(r.request_id, r.prompt, r.params) for r in admitted]
        removes, self._removes = self._removes, []
        plan = StepPlan(
            PlanKind.STEP, self._step_id, self._fingerprint, self._last_digest,
            self._last_step_done, self._prefill_chunk(admitted, removes),
            inserts=inserts, removes=removes,
        )
        if self._spec is not None:
            running = [r.request.params for uid, r in self._running.items() if uid not in removes]
            plan.draft_slots = self._spec.slots_for(
                running, bool(admitted or removes), known_tokens(self._batch))
            plan.accepted = self._spec.last_accepted
        return PlannedStep(plan, admitted, self._broadcast(plan))

    def _prefill_chunk(self, admitted: list[GenerationRequest], removes: list[int]) -> int:
        """The next step's prefill chunk, by who will be decoding and who prefilling then."""
        staying = [r for uid, r in self._running.items() if uid not in removes]
        decoding = sum(r.started for r in staying)
        return self._pacer.chunk(decoding, len(staying) - decoding + len(admitted))

    def _step(self, planned: PlannedStep) -> None:
        """Apply this step's plan, send the next one, run the step and hand out its tokens."""
        step_id = planned.plan.step_id
        self._faults.on_step(step_id)
        started = time.perf_counter()
        self._broadcast_payload(planned.payload)
        drafts = self._propose(planned.plan)
        self._apply(planned)
        self._fingerprint = self._batch.fingerprint(perturb=self._faults.desync_at(step_id))
        if self._busy_after_this_step():
            self._planned = self._plan(self._admit())
        else:
            self._planned = None
            self._broadcast(StepPlan(PlanKind.PAUSE))
        with self._batch.stats() as work:
            events = self._run(planned.plan, drafts)
        # A verifying step is no decode step, and a step with no sequence (the one planned
        # ahead of a last token) takes no time: timing either would skew the pacer's
        # decode step, and the arrival window with it (30% shorter after each lone request).
        if not drafts and (events or work.prompt_tokens):
            self._pacer.observe(
                time.perf_counter() - started, work.prompt_tokens, work.prompt_time)
        self._last_digest = digest_ints([v for e in events for v in (e.uid, e.token)])
        self._last_step_done = step_id
        self._dispatch(events)
        now = time.time()
        self._metrics.step_duration.observe(time.perf_counter() - started)
        self._metrics.steps.inc()
        self._metrics.last_step.set(now)
        sequences = len({e.uid for e in events})  # a verifying step emits several tokens
        self._metrics.batch_size.set(sequences)
        if events:
            self._metrics.batch_size_hist.observe(sequences)
        self._metrics.requests_running.set(len(self._running))
        self._show_kv()

    def _show_kv(self) -> None:
        kv = self._batch.kv
        if kv is not None:
            needs = [r.request.kv_tokens for r in self._running.values()]
            self._metrics.show_kv(kv.budgets, kv.usage(needs, self._batch.prompt_cache_bytes))

    def _propose(self, plan: StepPlan) -> list[int]:
        """Speculation: this step's drafts, sent to the workers (serving/engine/speculative.py)."""
        if self._spec is None or not plan.draft_slots:
            return []
        return self._spec.propose(self._batch, plan.draft_slots, self._channel)

    def _run(self, plan: StepPlan, drafts: list[int]) -> list[TokenEvent]:
        if self._spec is None:
            return self._batch.step(plan.prefill_chunk)
        if drafts:
            return self._spec.verify(self._batch, drafts)
        self._spec.last_accepted = 0
        return self._batch.step(plan.prefill_chunk)

    def _apply(self, planned: PlannedStep) -> None:
        cached_before, hits_before = self._batch.cached_tokens, self._batch.cache_hits
        self._faults.on_insert([ins.prompt for ins in planned.plan.inserts])
        uids = self._batch.apply(planned.plan.inserts, planned.plan.removes)
        self._metrics.prefix_cache_tokens.inc(self._batch.cached_tokens - cached_before)
        self._metrics.prefix_cache_hits.inc(self._batch.cache_hits - hits_before)
        for uid, request in zip(uids, planned.admitted, strict=True):
            self._running[uid] = RunningRequest(request, self._tokenizer, self._metrics)
            self._metrics.prompt_tokens.inc(len(request.prompt))

    def _broadcast(self, plan: StepPlan) -> bytes:
        """Queue the plan's header; returns its payload, which goes out when its step starts."""
        if self._channel is None:
            return b""
        with self._comm_timer():
            return self._channel.send_header(plan, wait=self._comm_profile)

    def _broadcast_payload(self, payload: bytes) -> None:
        if self._channel is not None and payload:
            with self._comm_timer():
                self._channel.send_payload(payload, wait=self._comm_profile)

    @contextlib.contextmanager
    def _comm_timer(self) -> Iterator[None]:
        """With comm_profile on, time one plan collective alone: drain the stream first."""
        if not self._comm_profile or self._channel is None:
            yield
            return
        self._channel.synchronize()
        tic = time.perf_counter()
        yield
        self._metrics.step_comm.observe(time.perf_counter() - tic)

    def _dispatch(self, events: list[TokenEvent]) -> None:
        for event in events:
            running = self._running.get(event.uid)
            if running is None:
                continue  # removed on rank 0 already; the plan told the workers
            running.on_token(event.token, event.finish_reason, event.logprobs)
            if event.finish_reason is not None:
                del self._running[event.uid]  # BatchGenerator dropped it on every rank

    def fail_all(self, message: str, code: str) -> None:
        """End every waiting, planned and running request with an error (stop or engine
        failure)."""
        with self._lock:
            waiting, self._waiting = list(self._waiting), collections.deque()
        planned, self._planned = self._planned, None
        for request in waiting + (planned.admitted if planned else []):
            request.sink.push(Failed(message, code))
        for running in self._running.values():
            running.request.sink.push(Failed(message, code))
        self._running.clear()
