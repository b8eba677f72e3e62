"""OpenAI-shaped errors for the gateway: one exception type, one mapping to HTTP."""

from __future__ import annotations

from litestar import Request, Response
from litestar.exceptions import HTTPException

from contract.openai_errors import ErrorBody, ErrorEnvelope


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


def api_error_handler(_: Request, exc: Exception) -> Response:
    assert isinstance(exc, ApiError)
    return Response(ErrorEnvelope(exc.body), status_code=exc.status, headers=exc.headers)


def http_exception_handler(_: Request, exc: Exception) -> Response:
    """Litestar's own errors (unknown route, wrong method, body too large) in OpenAI's shape."""
    assert isinstance(exc, HTTPException)
    kind = "server_error" if exc.status_code >= 500 else "invalid_request_error"
    body = ErrorBody(str(exc.detail), kind)
    return Response(ErrorEnvelope(body), status_code=exc.status_code, headers=exc.headers or {})
