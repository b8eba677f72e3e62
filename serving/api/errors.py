"""OpenAI-shaped errors: every failure the API returns goes through this module."""

from __future__ import annotations

import logging

from litestar import Request, Response
from litestar.exceptions import HTTPException

from contract.openai_errors import ErrorBody, ErrorEnvelope

log = logging.getLogger("serving.api")

class OpenAIError(Exception):
    """An error the API reports to the client in OpenAI's shape."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.body = ErrorBody(message, type, param, code)
        self.headers = headers or {}


def invalid(message: str, param: str | None, code: str | None = None) -> OpenAIError:
    return OpenAIError(400, message, param=param, code=code)


def model_not_found(model: str) -> OpenAIError:
    return OpenAIError(
        404, f"The model '{model}' does not exist", param="model", code="model_not_found"
    )


def unavailable(message: str) -> OpenAIError:
    return OpenAIError(503, message, type="service_unavailable", code="service_unavailable")


def queue_full(message: str, retry_after_s: int = 1) -> OpenAIError:
    return OpenAIError(
        429, message, type="rate_limit_error", code="queue_full",
        headers={"Retry-After": str(retry_after_s)},
    )


def to_response(exc: OpenAIError) -> Response[ErrorEnvelope]:
    return Response(ErrorEnvelope(exc.body), status_code=exc.status, headers=exc.headers)


def handle_openai_error(_: Request, exc: OpenAIError) -> Response[ErrorEnvelope]:
    return to_response(exc)


_HTTP_TYPES = {
    400: ("invalid_request_error", None),
    404: ("invalid_request_error", "not_found"),
    405: ("invalid_request_error", "method_not_allowed"),
    413: ("invalid_request_error", "request_too_large"),
}


def handle_http_exception(_: Request, exc: HTTPException) -> Response[ErrorEnvelope]:
    """Litestar's own errors (unknown route, body too large ...) in OpenAI's shape."""
    err_type, code = _HTTP_TYPES.get(exc.status_code, ("api_error", None))
    # Keep Litestar's headers: a 405's Allow names the methods the route serves.
    headers = dict(exc.headers or {})
    return to_response(
        OpenAIError(exc.status_code, exc.detail, type=err_type, code=code, headers=headers)
    )


def handle_unexpected(_: Request, exc: Exception) -> Response[ErrorEnvelope]:
    log.exception("unhandled error in a request handler", exc_info=exc)
    return to_response(OpenAIError(500, "internal server error", type="api_error"))


EXCEPTION_HANDLERS = {
    OpenAIError: handle_openai_error,
    HTTPException: handle_http_exception,
    Exception: handle_unexpected,
}
