"""Server-sent events in OpenAI's streaming format."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

from contract.openai_errors import DONE_EVENT, sse_error_event
from contract.openai_errors import sse_event as sse
from contract.openai_schemas import Usage
from serving.api.generation import Admitted, failure_error
from serving.engine.requests import Failed, Finished, TextDelta


def usage_of(done: Finished) -> Usage:
    total = done.prompt_tokens + done.completion_tokens
    return Usage(done.prompt_tokens, done.completion_tokens, total)


async def stream_events(
    admitted: Admitted,
    *,
    first: Callable[[], object] | None,
    delta: Callable[[TextDelta], list[object]],
    final: Callable[[Finished], list[object]],
    usage: Callable[[Usage], object] | None,
) -> AsyncIterator[bytes]:
    """Format the engine's events as SSE chunks, ending with `data: [DONE]`.

    A failure mid-stream (timeout, shutdown) is sent as an error event so the client
    sees why the stream ended. The opening chunk waits for the first generated event: a
    stream whose engine failed before any token starts with the error, which tells the
    orchestrator's gateway that it may resend the request to the next gang.
    """
    async for event in admitted.events():
        if first is not None and not isinstance(event, Failed):
            yield sse(first())
            first = None
        if isinstance(event, TextDelta):
            for chunk in delta(event):
                yield sse(chunk)
        elif isinstance(event, Finished):
            for chunk in final(event):
                yield sse(chunk)
            if usage is not None:
                yield sse(usage(usage_of(event)))
        elif isinstance(event, Failed):
            yield sse_error_event(failure_error(event).body)
    yield DONE_EVENT
