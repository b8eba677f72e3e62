"""The OpenAI error shape, the codes rank 0 uses for a failing gang, and the SSE error event.

Rank 0's API and the orchestrator's gateway both answer in this shape; the gateway reads
rank 0's codes to tell "this gang is going away, resend" from "this request is wrong".
"""

from __future__ import annotations

import msgspec

# Codes of a request that ended because of the server, not the client.
ENGINE_ERROR = "engine_error"  # the engine failed: the gang is going away
SHUTDOWN = "shutdown"  # rank 0 is stopping
TIMEOUT = "timeout"  # the request ran past request_timeout_s
GANG_FAILURE_CODES = frozenset({ENGINE_ERROR, SHUTDOWN})

DONE_EVENT = b"data: [DONE]\n\n"


class ErrorBody(msgspec.Struct):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorEnvelope(msgspec.Struct):
    error: ErrorBody


def sse_event(payload: object) -> bytes:
    return b"data: " + msgspec.json.encode(payload) + b"\n\n"


def sse_error_event(body: ErrorBody) -> bytes:
    """The event that ends a stream which failed: the error, for the client to read."""
    return sse_event(ErrorEnvelope(body))


def error_code_of_event(chunk: bytes) -> str | None:
    """The error code when `chunk` opens with an SSE error event, else None."""
    head = chunk.split(b"\n\n", 1)[0]
    if not head.startswith(b"data: {"):
        return None
    try:
        return msgspec.json.decode(head[len(b"data: ") :], type=ErrorEnvelope).error.code
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
