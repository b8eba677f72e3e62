"""OpenAI-shaped errors for the gateway: one exception type, one mapping to HTTP."""

from __future__ import annotations

import msgspec
from litestar import Request, Response
from litestar.exceptions import HTTPException


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
        self.status, self.message, self.type = status, message, type
        self.code, self.param, self.headers = code, param, headers or {}

    def body(self) -> dict[str, dict[str, str | None]]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }


def unauthorized(message: str) -> ApiError:
    return ApiError(401, message, type="invalid_request_error", code="invalid_api_key")


def unavailable(message: str, retry_after_s: int, code: str = "cluster_unavailable") -> ApiError:
    return ApiError(
        503, message, type="server_error", code=code, headers={"Retry-After": str(retry_after_s)}
    )


def sse_error_event(error: ApiError) -> bytes:
    """The last event of a stream cut mid-way: an error the client can read, then DONE."""
    return b"data: " + msgspec.json.encode(error.body()) + b"\n\ndata: [DONE]\n\n"


def api_error_handler(_: Request, exc: Exception) -> Response:
    assert isinstance(exc, ApiError)
    return Response(exc.body(), status_code=exc.status, headers=exc.headers)


def http_exception_handler(_: Request, exc: Exception) -> Response:
    """Litestar's own errors (unknown route, wrong method, body too large) in OpenAI's shape."""
    assert isinstance(exc, HTTPException)
    kind = "server_error" if exc.status_code >= 500 else "invalid_request_error"
    error = ApiError(exc.status_code, str(exc.detail), type=kind, code=None)
    return Response(error.body(), status_code=exc.status_code, headers=exc.headers or {})
