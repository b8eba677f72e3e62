"""Server-sent events in OpenAI's streaming format."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import msgspec

from contract.openai_errors import DONE_EVENT, sse_error_event
from contract.openai_errors import sse_event as sse
from contract.openai_schemas import Usage
from serving.api.generation import Admitted, failure_error
from serving.api.timings import timings_of
from serving.engine.requests import Failed, Finished, TextDelta


def usage_of(done: Finished) -> Usage:
    total = done.prompt_tokens + done.completion_tokens
    return Usage(done.prompt_tokens, done.completion_tokens, total)


async def stream_events(
    admitted: Admitted,
    *,
    first: Callable[[], object] | None,
    delta: Callable[[TextDelta], list[Any]],
    final: Callable[[Finished], list[Any]],
    usage: Callable[[Usage], Any] | None,
    timed: bool = False,
) -> AsyncIterator[bytes]:
    """Format the engine's events as SSE chunks, ending with `data: [DONE]`.

    A failure mid-stream (timeout, shutdown) is sent as an error event so the client
    sees why the stream ended. The opening chunk waits for the first generated event: a
    stream whose engine failed before any token starts with the error, which tells the
    orchestrator's gateway that it may resend the request to the next gang. `timed` puts
    the `timings` on the last chunk (the usage chunk when asked for).
    """
    async for event in admitted.events():
        if first is not None and not isinstance(event, Failed):
            yield sse(first())
            first = None
        if isinstance(event, TextDelta):
            for chunk in delta(event):
                yield sse(chunk)
        elif isinstance(event, Finished):
            chunks = final(event)
            if usage is not None:
                chunks.append(usage(usage_of(event)))
            if timed:
                chunks[-1] = msgspec.structs.replace(chunks[-1], timings=timings_of(event))
            for chunk in chunks:
                yield sse(chunk)
        elif isinstance(event, Failed):
            yield sse_error_event(failure_error(event).body)
    yield DONE_EVENT
