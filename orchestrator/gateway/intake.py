"""What a client may make the gateway hold before its request reaches rank 0.

Bodies (up to MAX_BODY_BYTES each) are read whole before they are forwarded: at most
MAX_BODIES_READING at a time, each within BODY_TIMEOUT_S, so that slow or many uploads
cannot take the gateway's memory or every slot (a busy gateway answers 503 "overloaded",
a body that does not arrive in time 408). The status page's live charts hold a stream
each: at most MAX_WATCHERS at once (429 beyond).
"""

from __future__ import annotations

import asyncio

from litestar import Request
from litestar.connection import ASGIConnection
from litestar.handlers import BaseRouteHandler

from contract.openai_errors import ApiError

MAX_BODIES_READING = 64
BODY_TIMEOUT_S = 30.0
MAX_WATCHERS = 32


class BodySlots:
    """The bound on bodies being read at once, and on how long each may take."""

    def __init__(self, limit: int = MAX_BODIES_READING,
                 timeout_s: float = BODY_TIMEOUT_S) -> None:
        self.limit, self.timeout_s = limit, timeout_s
        self.reading = 0

    async def read(self, request: Request) -> bytes:
        """The whole body (Litestar keeps it for the handler), or a 503/408 ApiError."""
        if self.reading >= self.limit:
            raise ApiError(503, f"the gateway is already receiving {self.limit} request "
                           f"bodies; retry shortly", code="overloaded",
                           headers={"Retry-After": "1"})
        self.reading += 1
        try:
            async with asyncio.timeout(self.timeout_s):
                return await request.body()
        except TimeoutError:
            raise ApiError(408, f"the request body did not arrive within {self.timeout_s:g} s",
                           code="request_timeout", headers={"Connection": "close"}) from None
        finally:
            self.reading -= 1


async def read_body_bounded(connection: ASGIConnection, _: BaseRouteHandler) -> None:
    """A guard, after the key's: the body read here, within the bound, before the handler's
    parameters are (they read the kept body)."""
    if isinstance(connection, Request) and connection.method == "POST":
        await connection.app.state.gateway.bodies.read(connection)


def too_many_watchers() -> ApiError:
    return ApiError(429, f"{MAX_WATCHERS} live charts are already open; close one or "
                    f"reload later", code="too_many_watchers", headers={"Retry-After": "5"})
