"""How a request lost with its gang is resent: at once, or after its failure's cause.

A request that was at rank 0 when its gang failed is a suspect only if the failure could
be its doing (orchestrator/gateway/quarantine.py), which the supervisor knows a fraction
of a second after the gateway saw the connection drop. With one gang the resend waits for
the relaunch anyway, so it waits for that cause (up to CAUSE_WAIT_S) and then runs alone
or batched. When another replica is ready right now, the request does not wait: it is
resent at once, batched there, while the cause is awaited beside it. If the cause comes
back as one the request could have caused (a crash, out of memory, a hang, or none known
within CAUSE_WAIT_S) before that run's answer began, the run is withdrawn (its connection
closed: rank 0 frees the slot) and the request becomes a suspect like any other, resent
alone. It still counts the first gang's loss: a second failed gang with it at rank 0 is
the request of death (a 500, never resent), so a request that crashes gangs costs at most
MAX_RESTARTS_PER_REQUEST restarts whichever way it was resent.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import TypeVar

from orchestrator.gateway.booking import Launches
from orchestrator.gateway.quarantine import CAUSE_WAIT_S, could_be_the_request
from orchestrator.gateway.view import ClusterView

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass(frozen=True)
class Resend:
    """How the next send of a request goes."""

    alone: bool = False  # a suspect: rank 0 to itself (quarantine.IsolationGate)
    unclassified: str = ""  # the launch it was lost with, resent before that failure's cause


class Suspected(Exception):
    """A run sent before the first gang's failure was classified is withdrawn: the cause
    could be the request's doing, so it runs again alone."""


class Triage:
    def __init__(self, view: ClusterView) -> None:
        self.view = view
        self._logged: Launches[bool] = Launches()  # launches whose at-once resend is logged

    async def after_loss(self, launch: str, deadline: float) -> tuple[bool, str]:
        """(alone, unclassified) for the resend of a request lost with `launch`: by its
        failure's cause if known; resent at once (cause unknown) when another replica is
        ready now; else by the cause, waited for up to CAUSE_WAIT_S."""
        failure = await self.view.failure_of(launch, 0.0)
        if failure is None and await self.view.wait_for_upstream(0.0, launch) is not None:
            if self._logged.get(launch) is None:
                self._logged.note(launch, True)
                log.info("requests lost with launch %s: resent at once to another replica, "
                         "before the failure's cause is known", launch)
            return False, launch
        if failure is None:
            wait = min(CAUSE_WAIT_S, max(0.0, deadline - time.monotonic()))
            failure = await self.view.failure_of(launch, wait)
        return could_be_the_request(failure), ""

    async def unless_suspect(self, send: Awaitable[T], unclassified: str) -> T:
        """`send`'s result; with `unclassified` (a launch lost before), Suspected when that
        launch's failure could be the request's doing and is known before `send` ends."""
        if not unclassified:
            return await send
        sending = asyncio.ensure_future(send)
        cause = asyncio.ensure_future(self.view.failure_of(unclassified, CAUSE_WAIT_S))
        try:
            await asyncio.wait({sending, cause}, return_when=asyncio.FIRST_COMPLETED)
            if sending.done() or not could_be_the_request(cause.result()):
                return await sending
            sending.cancel()
            await asyncio.gather(sending, return_exceptions=True)  # it is resent anyway
            failure = cause.result()
            log.warning("launch %s failed: %s; a request of it resent at once is withdrawn "
                        "to run alone", unclassified,
                        failure.summary() if failure else "cause unknown")
            raise Suspected(unclassified)
        finally:
            cause.cancel()
            if not sending.done():
                sending.cancel()
