"""The guard of rank 0's /v1 routes: only a request carrying the launch's secret passes.

Rank 0 listens on its node's address, so anyone on that network could send it
completions around the gateway's API key; the gateway adds the secret (HEADER) that the
orchestrator drew for this launch. A request without it, or with another, gets 401 in the
API's error shape before its body is read: nothing is generated.
/health and /metrics stay open, as the gateway's are: they generate nothing.
"""

from __future__ import annotations

from litestar.connection import ASGIConnection
from litestar.handlers.base import BaseRouteHandler

from contract.launch_secret import HEADER, secret_matches
from contract.openai_errors import ApiError
from serving.api.state import ServingState


async def require_launch_secret(connection: ASGIConnection, _: BaseRouteHandler) -> None:
    # Async on purpose: Litestar runs a sync guard in a worker thread (a hop per request).
    serving: ServingState = connection.app.state.serving
    expected = serving.launch_secret
    if expected is None:
        return
    given = connection.headers.get(HEADER)
    if given is None:
        raise ApiError(401, f"missing {HEADER}: rank 0 answers only the orchestrator's gateway")
    if not secret_matches(given, expected):
        raise ApiError(401, f"incorrect {HEADER}")
