"""No request of death: the gate that runs suspect requests alone.

A request that was at rank 0 when its gang failed is a suspect: it may be what killed the
gang. The gateway resends a suspect only when nothing else is at rank 0, and holds every
other request back until it is done (suspects first, one at a time, then the rest batched
again). A suspect whose isolated run fails the gang again is the request of death: it is
answered with a 500 and never resent (orchestrator/gateway/proxy.py). One request thus
spends at most MAX_RESTARTS_PER_REQUEST restarts of the cluster's budget.

"At rank 0" spans a request's send until its answer begins (a whole answer, or a stream's
first event): a crash when a request is inserted or prefilled falls inside it; a stream
already flowing is not waited for (it cannot be resent anyway).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from contract.openai_errors import ApiError

# The batched run that failed first, and the isolated run that failed again.
MAX_RESTARTS_PER_REQUEST = 2


def request_of_death(cause: str) -> ApiError:
    """The answer to a request whose isolated run failed the gang: the server's fault as
    far as the API goes (a 500), but a resend would crash it again, so say so."""
    detail = f": {cause}" if cause else ""
    return ApiError(
        500,
        "this request crashed the model server twice, the second time running alone, and "
        f"will not be retried{detail}",
        code="request_crashed_server",
    )


class IsolationGate:
    """A writer-preferring gate: ordinary requests share rank 0, a suspect has it alone."""

    def __init__(self) -> None:
        self._changed = asyncio.Condition()
        self._ordinary = 0  # ordinary requests at rank 0
        self._isolated = False  # a suspect is at rank 0
        self._suspects_waiting = 0

    @property
    def suspects_waiting(self) -> int:
        return self._suspects_waiting

    @asynccontextmanager
    async def ordinary(self) -> AsyncIterator[None]:
        """Held while an ordinary request is at rank 0; waits while any suspect waits."""
        async with self._changed:
            await self._changed.wait_for(
                lambda: not self._isolated and self._suspects_waiting == 0
            )
            self._ordinary += 1
        try:
            yield
        finally:
            async with self._changed:
                self._ordinary -= 1
                self._changed.notify_all()

    @asynccontextmanager
    async def isolated(self) -> AsyncIterator[None]:
        """Held while a suspect is at rank 0, alone."""
        async with self._changed:
            self._suspects_waiting += 1
            try:
                await self._changed.wait_for(
                    lambda: not self._isolated and self._ordinary == 0
                )
            finally:
                self._suspects_waiting -= 1
                self._changed.notify_all()
            self._isolated = True
        try:
            yield
        finally:
            async with self._changed:
                self._isolated = False
                self._changed.notify_all()
