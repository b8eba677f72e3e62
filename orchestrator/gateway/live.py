"""`GET /status/live`: the charts' samples as server-sent events, for the status page.

First an `event: history` with every sample kept (and the sampling interval and window),
then an `event: sample` as each new one is taken. The page reads it with fetch, not
EventSource, so that it can send the API key.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import msgspec
from litestar import get
from litestar.datastructures import State
from litestar.response import ServerSentEvent, ServerSentEventMessage

from orchestrator.gateway.charts import ChartHistory, ChartSample
from orchestrator.gateway.intake import MAX_WATCHERS, too_many_watchers
from orchestrator.gateway.view import ClusterView

DRAIN_CHECK_S = 0.5


class HistoryMessage(msgspec.Struct, kw_only=True):
    interval_s: float
    window_s: float
    samples: list[ChartSample]


@get("/live", include_in_schema=False)
async def live_endpoint(state: State) -> ServerSentEvent:
    history: ChartHistory = state.charts
    view: ClusterView = state.gateway.view
    if history.watchers >= MAX_WATCHERS:  # each holds a connection and a queue
        raise too_many_watchers()
    # Registered here, not when the stream starts: the next request counts this one.
    events = live_events(history, view, history.new_watcher())
    return ServerSentEvent(events, headers={"Cache-Control": "no-store"})


async def live_events(
    history: ChartHistory, view: ClusterView, queue: asyncio.Queue[ChartSample]
) -> AsyncIterator[ServerSentEventMessage]:
    try:
        kept = HistoryMessage(interval_s=history.interval_s, window_s=history.window_s,
                              samples=list(history.samples))
        yield ServerSentEventMessage(event="history", data=msgspec.json.encode(kept).decode())
        # Ends when shutdown begins: an open page must not hold the gateway's graceful stop.
        while not view.draining:
            try:
                sample = await asyncio.wait_for(queue.get(), DRAIN_CHECK_S)
            except TimeoutError:
                continue
            yield ServerSentEventMessage(event="sample", data=msgspec.json.encode(sample).decode())
    finally:
        history.forget(queue)
