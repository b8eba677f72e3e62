"""The official `openai` SDK's own reading of a Responses event stream, for tests: each event
validated against its pydantic type, then fed to the accumulator `client.responses.stream()`
uses, which refuses an event out of order."""

from __future__ import annotations

import json
from typing import Any

import pydantic
from openai import omit
from openai.lib.streaming.responses._responses import ResponseStreamState
from openai.types.responses import Response, ResponseStreamEvent

EVENTS: pydantic.TypeAdapter[Any] = pydantic.TypeAdapter(ResponseStreamEvent)


def sse_events(raw: bytes) -> list[dict[str, Any]]:
    """The events' data, checking that each `event:` line names its data's `type`."""
    out = []
    for block in raw.decode().split("\n\n"):
        if not block.strip():
            continue
        lines = dict(line.split(": ", 1) for line in block.split("\n"))
        data = json.loads(lines["data"])
        assert lines["event"] == data["type"], block
        out.append(data)
    return out


def accumulate(events: list[dict[str, Any]]) -> Response:
    """The SDK's final response after every event, as `responses.stream()` builds it."""
    state: ResponseStreamState[Any] = ResponseStreamState(input_tools=omit, text_format=omit)
    for data in events:
        state.handle_event(EVENTS.validate_python(data))
    final = state._completed_response  # what the stream's get_final_response() returns
    assert final is not None, "no response.completed"
    return final
