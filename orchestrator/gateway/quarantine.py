"""No request of death: the gate that runs suspect requests alone.

A request that was at rank 0 when its gang failed is a suspect when the failure, as the
supervisor classified it, could be the request's doing: a rank's exception or crash (a
segfault, an abort), out of memory, a desync, a hang, or a peer lost with nothing else
known. A rank killed from outside (SIGKILL without memory pressure, SIGTERM, ...), a node
or a link lost, is no request's doing: its requests are resent at once, batched, to the
next ready gang (another replica, or the relaunch). Unclassified within CAUSE_WAIT_S:
a suspect.

The gateway resends a suspect only when nothing else is at rank 0, and holds every
other request back until it is done (suspects first, one at a time, then the rest batched
again). A request that was at rank 0 in a second failed gang is the request of death: it
is answered with a 500 and never resent (orchestrator/gateway/proxy.py), whether that run
was isolated (a suspect) or batched (its first gang was killed from outside). One request
thus spends at most MAX_RESTARTS_PER_REQUEST restarts of the cluster's budget.

"At rank 0" spans a request's send until its answer begins (a whole answer, or a stream's
first event): a crash when a request is inserted or prefilled falls inside it; a stream
already flowing is not waited for (it cannot be resent anyway).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from contract.openai_errors import ApiError
from orchestrator.supervision.failures import Cause, RankFailure

# The batched run that failed first, and the (isolated) run that failed again.
MAX_RESTARTS_PER_REQUEST = 2
# How long a request lost with its gang waits for the supervisor to classify the failure
# (an agent reports a rank's exit within a fraction of a second).
CAUSE_WAIT_S = 5.0
# Signals only something outside the rank sends; a request's crash raises SIGSEGV, SIGABRT..
OUTSIDE_SIGNALS = frozenset({"SIGKILL", "SIGTERM", "SIGINT", "SIGHUP"})
NOT_A_REQUEST = frozenset({Cause.AGENT_LOST, Cause.LINK_DOWN, Cause.EBUSY,
                           Cause.SPAWN_FAILED, Cause.INIT_TIMEOUT})


def could_be_the_request(failure: RankFailure | None) -> bool:
    """Whether a gang's failure could be the doing of a request it was serving (unknown:
    it could). A SIGKILL under memory pressure is classified oom, so it stays a suspect."""
    if failure is None:
        return True
    if failure.cause in NOT_A_REQUEST:
        return False
    return not (failure.cause == Cause.RANK_CRASHED and failure.signal in OUTSIDE_SIGNALS)


def request_of_death(cause: str, *, alone: bool = True) -> ApiError:
    """The answer to a request whose second run failed the gang: the server's fault as
    far as the API goes (a 500), but a resend could crash it again, so say so."""
    detail = f": {cause}" if cause else ""
    how = ("crashed the model server twice, the second time running alone" if alone else
           "was at the model server when it failed twice, the first time stopped from "
           "outside")
    return ApiError(500, f"this request {how}, and will not be retried{detail}",
                    code="request_crashed_server")


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
