"""Rank 0's errors: the shorthands its handlers raise, and Litestar's handlers for them.

The error type and its status table are contract/openai_errors.py's, shared with the
gateway; the body is OpenAI's shape, or Anthropic's on /v1/messages.
"""

from __future__ import annotations

import logging

from litestar import Request, Response
from litestar.exceptions import HTTPException

from contract.anthropic_schemas import error_payload
from contract.openai_errors import ApiError

log = logging.getLogger("serving.api")


def invalid(message: str, param: str | None, code: str | None = None) -> ApiError:
    return ApiError(400, message, param=param, code=code)


def check_served(model: str | None, served: str | frozenset[str]) -> None:
    """`served`: the model's id, or its id and aliases (ServingState.model_ids)."""
    known = model == served if isinstance(served, str) else model in served
    if not known:
        raise model_not_found(str(model))


def model_not_found(model: str) -> ApiError:
    return ApiError(
        404, f"The model '{model}' does not exist", param="model", code="model_not_found"
    )


def unavailable(message: str) -> ApiError:
    return ApiError(503, message)


def queue_full(message: str, retry_after_s: int = 1) -> ApiError:
    return ApiError(429, message, code="queue_full", headers={"Retry-After": str(retry_after_s)})


def to_response(request: Request, exc: ApiError) -> Response[object]:
    return Response(
        error_payload(exc, request.url.path), status_code=exc.status, headers=exc.headers
    )


def handle_api_error(request: Request, exc: ApiError) -> Response[object]:
    return to_response(request, exc)


def handle_http_exception(request: Request, exc: HTTPException) -> Response[object]:
    """Litestar's own errors (unknown route, body too large ...) in the API's shape."""
    # Keep Litestar's headers: a 405's Allow names the methods the route serves.
    headers = dict(exc.headers or {})
    return to_response(request, ApiError(exc.status_code, exc.detail, headers=headers))


def handle_unexpected(request: Request, exc: Exception) -> Response[object]:
    log.exception("unhandled error in a request handler", exc_info=exc)
    return to_response(request, ApiError(500, "internal server error"))


EXCEPTION_HANDLERS = {
    ApiError: handle_api_error,
    HTTPException: handle_http_exception,
    Exception: handle_unexpected,
}
