"""The status page's charts: the cluster's figures over the last 15 minutes, sampled in the
gateway every few seconds and kept in a bounded ring buffer.

    every SAMPLE_S: rank 0's counters (the supervisor's latest scrape, every second) + /status
      ─▶ ChartSample: tokens/s since the previous sample, TTFT p50/p99 of the requests
         of the last TTFT_WINDOW_S, running and waiting requests, each node's memory
         in use, the gang's state and restart count; with [[instances]] the same figures
         per instance (`instances`), the top-level ones then summed (no TTFT)
      ─▶ ChartHistory (WINDOW_S of samples, the oldest dropped) ─▶ each watcher's queue
         (orchestrator/gateway/live.py pushes them as server-sent events)
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import weakref
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from contextlib import asynccontextmanager
from typing import Any, TypeVar

from msgspec import Struct

from orchestrator.status.model import ClusterStatus
from orchestrator.supervision.progress import ServingSample, quantile_of_histogram

log = logging.getLogger("orchestrator.gateway")
SAMPLE_S = 3.0
WINDOW_S = 900.0
TTFT_WINDOW_S = 30.0  # a few requests' worth: one sample's own TTFTs are too few to rank
WATCHER_BACKLOG = 16  # samples a slow page may lag by before the oldest are dropped

Buckets = list[tuple[float, float]]


class InstancePoint(Struct, kw_only=True, omit_defaults=True):
    """One instance's figures at one point; a figure left out was not known (rank 0 did
    not answer, no request started in the window)."""

    state: str
    restarts: int = 0
    tokens_per_s: float | None = None
    ttft_p50_s: float | None = None
    ttft_p99_s: float | None = None
    running: int | None = None
    waiting: int | None = None


class ChartSample(Struct, kw_only=True, omit_defaults=True):
    """One point of every chart: the cluster's figures as InstancePoint's (a node's memory
    left out: its usage report is stale) and, with [[instances]], each instance's."""

    t: float  # unix time
    state: str
    restarts: int = 0
    tokens_per_s: float | None = None
    ttft_p50_s: float | None = None
    ttft_p99_s: float | None = None
    running: int | None = None
    waiting: int | None = None
    memory_used_bytes: dict[str, int] = {}  # node name -> bytes in use
    instances: dict[str, InstancePoint] = {}  # by instance name, with [[instances]]


P = TypeVar("P", InstancePoint, ChartSample)


class ChartHistory:
    """The last `window_s` of samples, and the queues of the pages watching them."""

    def __init__(self, interval_s: float = SAMPLE_S, window_s: float = WINDOW_S) -> None:
        self.interval_s, self.window_s = interval_s, window_s
        self.samples: deque[ChartSample] = deque(maxlen=round(window_s / interval_s))
        # Weak: a stream that never started (its client left first) holds no place.
        self._watchers: weakref.WeakSet[asyncio.Queue[ChartSample]] = weakref.WeakSet()

    def add(self, sample: ChartSample) -> None:
        self.samples.append(sample)
        for queue in self._watchers:
            if queue.full():  # a page that stopped reading loses its oldest, not our memory
                queue.get_nowait()
            queue.put_nowait(sample)

    def new_watcher(self) -> asyncio.Queue[ChartSample]:
        """A queue that gets each new sample from now on, until `forget`."""
        queue: asyncio.Queue[ChartSample] = asyncio.Queue(WATCHER_BACKLOG)
        self._watchers.add(queue)
        return queue

    def forget(self, queue: asyncio.Queue[ChartSample]) -> None:
        self._watchers.discard(queue)

    @contextlib.contextmanager
    def watch(self) -> Iterator[asyncio.Queue[ChartSample]]:
        queue = self.new_watcher()
        try:
            yield queue
        finally:
            self.forget(queue)

    @property
    def watchers(self) -> int:
        return len(self._watchers)


class Sampler:
    """Turns successive scrapes of rank 0's counters into per-interval figures."""

    def __init__(self, ttft_window_s: float = TTFT_WINDOW_S) -> None:
        self.ttft_window_s = ttft_window_s
        self._previous: tuple[float, ServingSample] | None = None
        self._ttft: deque[tuple[float, Buckets]] = deque()

    def sample(
        self, serving: ServingSample | None, status: ClusterStatus, now: float, wall: float
    ) -> ChartSample:
        return self.figures(_cluster_point(status, wall), serving, now)

    def figures(self, point: P, serving: ServingSample | None, now: float) -> P:
        """`point` with rank 0's figures (its state already set)."""
        if serving is None or point.state != "ready":  # else the last gang's last figures
            self._previous = None  # counters restart with the next gang: no rate across it
            self._ttft.clear()
            return point
        point.running, point.waiting = int(serving.running), int(serving.waiting)
        if self._previous is not None:
            then, before = self._previous
            tokens = serving.generation_tokens - before.generation_tokens
            rate = max(tokens, 0.0) / (now - then) if now > then else None
            point.tokens_per_s = None if rate is None else round(rate, 2)
        self._previous = (now, serving)
        p50, p99 = self._ttft_quantiles(serving.ttft_buckets, now)
        point.ttft_p50_s, point.ttft_p99_s = _ms(p50), _ms(p99)
        return point

    def _ttft_quantiles(self, buckets: Buckets, now: float) -> tuple[float | None, float | None]:
        """p50 and p99 of the first-token times observed within the window."""
        self._ttft.append((now, buckets))
        while self._ttft and self._ttft[0][0] < now - self.ttft_window_s:
            self._ttft.popleft()
        window = _difference(buckets, self._ttft[0][1])
        return quantile_of_histogram(window, 0.5), quantile_of_histogram(window, 0.99)


def _cluster_point(status: ClusterStatus, wall: float) -> ChartSample:
    """The cluster's state, restarts and each node's memory in use."""
    # Rounded: every digit is sent to every watching page every few seconds.
    point = ChartSample(t=round(wall, 1), state=status.state, restarts=status.restarts)
    for node in status.nodes:
        if node.memory_total_bytes and not node.usage_stale:
            used = node.memory_total_bytes - node.memory_available_bytes
            point.memory_used_bytes[node.name] = used
    return point


class InstancesSampler:
    """With [[instances]]: a Sampler per instance; the cluster's tokens/s and requests are
    their sums (TTFT has no sum: the page draws it per instance)."""

    def __init__(self) -> None:
        self.samplers: dict[str, Sampler] = {}

    def sample(self, serving: Mapping[str, ServingSample | None], status: ClusterStatus,
               now: float, wall: float) -> ChartSample:
        point = _cluster_point(status, wall)
        known = {part.name: part for part in status.instances}
        for name, latest in serving.items():
            part = known.get(name)
            figures = InstancePoint(state=part.state if part else "pending",
                                    restarts=part.restarts if part else 0)
            sampler = self.samplers.setdefault(name, Sampler())
            point.instances[name] = sampler.figures(figures, latest, now)
        parts = point.instances.values()
        point.tokens_per_s = _total([p.tokens_per_s for p in parts])
        running, waiting = _total([p.running for p in parts]), _total([p.waiting for p in parts])
        point.running = None if running is None else int(running)
        point.waiting = None if waiting is None else int(waiting)
        return point


def _total(figures: list[float | None] | list[int | None]) -> float | None:
    """The sum of the known figures; None when none is."""
    known = [figure for figure in figures if figure is not None]
    return round(sum(known), 2) if known else None


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds, 4)


def _difference(now: Buckets, then: Buckets) -> Buckets:
    """Counts observed between two cumulative histograms (all of `now` if rank 0 restarted
    in between: its counters went back)."""
    before = dict(then)
    if any(count < before.get(upper, 0.0) for upper, count in now):
        return now
    return [(upper, count - before.get(upper, 0.0)) for upper, count in now]


def sampling(
    history: ChartHistory,
    status: Callable[[], ClusterStatus],
    serving: Callable[[], ServingSample | None] | None,
    instances: Callable[[], Mapping[str, ServingSample | None]] | None = None,
) -> Callable[[Any], contextlib.AbstractAsyncContextManager[None]]:
    """A lifespan hook for the gateway app: samples into `history` while the app runs
    (without `serving`, only the nodes' memory and the gang's state; with `instances`,
    each instance's rank 0 counters by name, per instance)."""

    async def loop() -> None:
        sampler, each = Sampler(), InstancesSampler()
        while True:
            try:
                now, wall = time.monotonic(), time.time()
                if instances is not None:
                    history.add(each.sample(instances(), status(), now, wall))
                else:
                    latest = serving() if serving is not None else None
                    history.add(sampler.sample(latest, status(), now, wall))
            except Exception:  # a chart point lost; the gateway must not be
                log.exception("chart sample failed")
            await asyncio.sleep(history.interval_s)

    @asynccontextmanager
    async def run(_: Any) -> AsyncIterator[None]:
        task = asyncio.create_task(loop())
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    return run
