"""The status page's charts: the cluster's figures over the last 15 minutes, sampled in the
gateway every few seconds and kept in a bounded ring buffer.

    every SAMPLE_S: rank 0's counters (the supervisor's latest scrape, every second) + /status
      ─▶ ChartSample: tokens/s since the previous sample, TTFT p50/p99 of the requests
         of the last TTFT_WINDOW_S, running and waiting requests, each node's memory
         in use, the gang's state and restart count
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
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from typing import Any

from msgspec import Struct

from orchestrator.status.model import ClusterStatus
from orchestrator.supervision.progress import ServingSample, quantile_of_histogram

log = logging.getLogger("orchestrator.gateway")
SAMPLE_S = 3.0
WINDOW_S = 900.0
TTFT_WINDOW_S = 30.0  # a few requests' worth: one sample's own TTFTs are too few to rank
WATCHER_BACKLOG = 16  # samples a slow page may lag by before the oldest are dropped

Buckets = list[tuple[float, float]]


class ChartSample(Struct, kw_only=True, omit_defaults=True):
    """One point of every chart; a figure left out was not known (rank 0 did not answer,
    no request started in the window, a node's usage report is stale)."""

    t: float  # unix time
    state: str
    restarts: int = 0
    tokens_per_s: float | None = None
    ttft_p50_s: float | None = None
    ttft_p99_s: float | None = None
    running: int | None = None
    waiting: int | None = None
    memory_used_bytes: dict[str, int] = {}  # node name -> bytes in use


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
        # Rounded: every digit is sent to every watching page every few seconds.
        point = ChartSample(t=round(wall, 1), state=status.state, restarts=status.restarts)
        for node in status.nodes:
            if node.memory_total_bytes and not node.usage_stale:
                used = node.memory_total_bytes - node.memory_available_bytes
                point.memory_used_bytes[node.name] = used
        if serving is None or status.state != "ready":  # else the last gang's last figures
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
) -> Callable[[Any], contextlib.AbstractAsyncContextManager[None]]:
    """A lifespan hook for the gateway app: samples into `history` while the app runs
    (without `serving`, only the nodes' memory and the gang's state)."""

    async def loop() -> None:
        sampler = Sampler()
        while True:
            try:
                latest = serving() if serving is not None else None
                history.add(sampler.sample(latest, status(), time.monotonic(), time.time()))
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
