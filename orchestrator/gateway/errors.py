"""OpenAI-shaped errors for the gateway: one exception type, one mapping to HTTP."""

from __future__ import annotations

import logging

from litestar import Request, Response
from litestar.exceptions import HTTPException

from contract.openai_errors import ErrorBody, ErrorEnvelope

log = logging.getLogger(__name__)


class ApiError(Exception):
    """An error the client sees as `{"error": {"message", "type", "param", "code"}}`."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str,
        code: str | None = None,
        param: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.headers = status, headers or {}
        self.body = ErrorBody(message, type, param, code)


def unauthorized(message: str) -> ApiError:
    return ApiError(401, message, type="invalid_request_error", code="invalid_api_key")


def unavailable(message: str, retry_after_s: int, code: str = "cluster_unavailable") -> ApiError:
    return ApiError(
        503, message, type="server_error", code=code, headers={"Retry-After": str(retry_after_s)}
    )


class ClientGone(Exception):
    """The client disconnected before its answer: nobody reads what we would send."""


def api_error_handler(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ApiError)
    request.app.state.gateway.metrics.responses.labels(status=str(exc.status)).inc()
    return Response(ErrorEnvelope(exc.body), status_code=exc.status, headers=exc.headers)


# Litestar's own client errors, coded as rank 0 codes them.
_HTTP_CODES = {404: "not_found", 405: "method_not_allowed", 413: "request_too_large"}


def http_exception_handler(request: Request, exc: Exception) -> Response:
    """Litestar's own errors (unknown route, wrong method, body too large) in OpenAI's shape,
    with their headers (405's Allow)."""
    assert isinstance(exc, HTTPException)
    headers = exc.headers or {}
    message = str(exc.detail)
    if exc.status_code == 405:
        allowed = headers.get("allow", "")
        message = f"{request.method} is not allowed on {request.url.path}; use {allowed}"
    kind = "server_error" if exc.status_code >= 500 else "invalid_request_error"
    body = ErrorBody(message, kind, code=_HTTP_CODES.get(exc.status_code))
    return Response(ErrorEnvelope(body), status_code=exc.status_code, headers=headers)


def unexpected_error_handler(_: Request, exc: Exception) -> Response:
    """A bug of ours still answers in OpenAI's shape (and is logged); a client that left
    gets nothing worth logging."""
    if isinstance(exc, ClientGone):
        return Response(b"", status_code=499)
    log.exception("unexpected error in the gateway", exc_info=exc)
    body = ErrorBody("internal error in the gateway", "server_error")
    return Response(ErrorEnvelope(body), status_code=500)
