"""The gateway's errors: its shorthands and Litestar's handlers. The error type and its
status table are contract/openai_errors.py's, shared with rank 0; the body is OpenAI's
shape, or Anthropic's on /v1/messages."""

from __future__ import annotations

import logging

from litestar import Request, Response
from litestar.exceptions import HTTPException

from contract.anthropic_schemas import error_payload
from contract.openai_errors import ApiError

log = logging.getLogger(__name__)


def unauthorized(message: str) -> ApiError:
    return ApiError(401, message)


def unavailable(message: str, retry_after_s: int, code: str = "cluster_unavailable") -> ApiError:
    return ApiError(503, message, code=code, headers={"Retry-After": str(retry_after_s)})


def check_utf8(body: bytes, headers: dict[str, str]) -> None:
    """Bytes that are not UTF-8 are the client's mistake: a 400 naming where, not a 500."""
    try:
        body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ApiError(400, f"the request body is not UTF-8: {exc.reason} at byte {exc.start}",
                       code="invalid_encoding") from None
    for name, value in headers.items():
        try:  # ASGI hands header values over as latin-1
            value.encode("latin-1").decode("utf-8")
        except UnicodeError:
            raise ApiError(400, f"the value of header {name!r} is not UTF-8",
                           code="invalid_encoding") from None


class ClientGone(Exception):
    """The client disconnected before its answer: nobody reads what we would send."""


def _response(request: Request, exc: ApiError) -> Response[object]:
    return Response(
        error_payload(exc, request.url.path), status_code=exc.status, headers=exc.headers
    )


def api_error_handler(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ApiError)
    # Under the instance the request went to (orchestrator/gateway/booking.py), else the
    # gateway's own: it never reached one (401, unknown model, ...).
    booking = request.state.get("booking")
    counters = booking.counters if booking is not None else request.app.state.gateway.unrouted
    counters.responses.labels(status=str(exc.status)).inc()
    return _response(request, exc)


def http_exception_handler(request: Request, exc: Exception) -> Response:
    """Litestar's own errors (unknown route, wrong method, body too large) in the API's
    shape, with their headers (405's Allow)."""
    assert isinstance(exc, HTTPException)
    headers = exc.headers or {}
    message = str(exc.detail)
    if exc.status_code == 405:
        allowed = headers.get("allow", "")
        message = f"{request.method} is not allowed on {request.url.path}; use {allowed}"
    return _response(request, ApiError(exc.status_code, message, headers=headers))


def unexpected_error_handler(request: Request, exc: Exception) -> Response:
    """A bug of ours still answers in the API's shape (and is logged); a client that left
    gets nothing worth logging."""
    if isinstance(exc, ClientGone):
        return Response(b"", status_code=499)
    log.exception("unexpected error in the gateway", exc_info=exc)
    return _response(request, ApiError(500, "internal error in the gateway"))
