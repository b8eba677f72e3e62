"""The one error type of the HTTP APIs, its status -> (type, code) table, and the SSE events.

Rank 0's API and the orchestrator's gateway both raise `ApiError` and answer in OpenAI's
shape (or Anthropic's on `/v1/messages`, contract/anthropic_schemas.py); each keeps only
its framework's handler. The gateway reads rank 0's codes to tell "this gang is going
away, resend" from "this request is wrong".
"""

from __future__ import annotations

from typing import NamedTuple

import msgspec

# Codes of a request that ended because of the server, not the client.
ENGINE_ERROR = "engine_error"  # the engine failed: the gang is going away
SHUTDOWN = "shutdown"  # rank 0 is stopping
TIMEOUT = "timeout"  # the request ran past request_timeout_s
GANG_FAILURE_CODES = frozenset({ENGINE_ERROR, SHUTDOWN})

DONE_EVENT = b"data: [DONE]\n\n"


class ErrorKind(NamedTuple):
    type: str  # OpenAI's error type
    code: str | None  # the code used when the raiser names none
    anthropic: str  # Anthropic's error type, on /v1/messages


# Every status either server answers with. 5xx are "server_error", as OpenAI's own; the
# code says which.
HTTP_ERRORS: dict[int, ErrorKind] = {
    400: ErrorKind("invalid_request_error", None, "invalid_request_error"),
    401: ErrorKind("invalid_request_error", "invalid_api_key", "authentication_error"),
    404: ErrorKind("invalid_request_error", "not_found", "not_found_error"),
    405: ErrorKind("invalid_request_error", "method_not_allowed", "invalid_request_error"),
    408: ErrorKind("invalid_request_error", "request_timeout", "invalid_request_error"),
    413: ErrorKind("invalid_request_error", "request_too_large", "request_too_large"),
    429: ErrorKind("rate_limit_error", "rate_limit_exceeded", "rate_limit_error"),
    # Nobody reads a 499: the client left.
    499: ErrorKind("invalid_request_error", "client_closed", "invalid_request_error"),
    500: ErrorKind("server_error", None, "api_error"),
    503: ErrorKind("server_error", "service_unavailable", "overloaded_error"),
    504: ErrorKind("server_error", "timeout", "timeout_error"),
}


def error_kind(status: int) -> ErrorKind:
    if status in HTTP_ERRORS:
        return HTTP_ERRORS[status]
    if status >= 500:
        return ErrorKind("server_error", None, "api_error")
    return ErrorKind("invalid_request_error", None, "invalid_request_error")


class ErrorBody(msgspec.Struct):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorEnvelope(msgspec.Struct):
    error: ErrorBody


class ApiError(Exception):
    """An error the client sees: a status, a message, and the field (`param`) at fault.

    The type comes from HTTP_ERRORS; `code` refines it (model_not_found, queue_full ...).
    """

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        kind = error_kind(status)
        self.status = status
        self.body = ErrorBody(message, kind.type, param, code or kind.code)
        self.headers = headers or {}


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
