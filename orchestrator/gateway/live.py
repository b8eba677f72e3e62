"""`GET /status/live`: the charts' samples as server-sent events, for the status page.

First an `event: history` with every sample kept (and the sampling interval and window),
then an `event: sample` as each new one is taken. The page reads it with fetch, not
EventSource, so that it can send the API key.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import msgspec
from litestar import get
from litestar.datastructures import State
from litestar.response import ServerSentEvent, ServerSentEventMessage

from orchestrator.gateway.charts import ChartHistory, ChartSample


class HistoryMessage(msgspec.Struct, kw_only=True):
    interval_s: float
    window_s: float
    samples: list[ChartSample]


@get("/live", include_in_schema=False)
async def live_endpoint(state: State) -> ServerSentEvent:
    history: ChartHistory = state.charts
    return ServerSentEvent(_events(history), headers={"Cache-Control": "no-store"})


async def _events(history: ChartHistory) -> AsyncIterator[ServerSentEventMessage]:
    with history.watch() as queue:
        kept = HistoryMessage(interval_s=history.interval_s, window_s=history.window_s,
                              samples=list(history.samples))
        yield ServerSentEventMessage(event="history", data=msgspec.json.encode(kept).decode())
        while True:
            sample = await queue.get()
            yield ServerSentEventMessage(event="sample", data=msgspec.json.encode(sample).decode())
