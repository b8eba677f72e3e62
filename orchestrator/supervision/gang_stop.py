"""Stopping a gang in bounded time, also when one of its nodes is away.

A node asleep never confirms a stop: waiting for it would keep the cluster in `restarting`
for as long as the agent's lease (15 s) or the request's timeout. Its ranks stay recorded
as unconfirmed and are reaped by PID (launch id checked) before the next launch. While the
stop runs, the gang's nodes are asked to answer (a ping): once the ones that do not answer
are known and every rank elsewhere confirmed its stop, the stop is over, and so is the end
of the link probes, without waiting the grace plus STOP_ANSWER_S for the silent nodes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from orchestrator.launch.gang import Gang
from orchestrator.supervision.interfaces import Answers, Links
from orchestrator.supervision.races import first_done

log = logging.getLogger(__name__)

STOP_ANSWER_S = 5.0  # past the ranks' grace, the most a node may take to confirm a stop
LEFTOVERS_S = 5.0
CONFIRMED_POLL_S = 0.1  # how often the ranks on the answering nodes are checked as stopped

Away = asyncio.Future[dict[str, str]]  # the nodes that did not answer the ping, with why


class GangStopper:
    """Stops one supervisor's gangs (ranks, link probes, the watch for nodes back) and keeps
    which nodes did not answer the last stop's ping, for the recovery that follows it."""

    def __init__(self, answers: Answers, links: Links | None,
                 unwatch_more: Callable[[], Awaitable[None]]) -> None:
        self.answers, self.links, self._unwatch_more = answers, links, unwatch_more
        self._silent: dict[str, str] = {}

    def forget(self) -> None:  # a launch: only the stop of the gang that fails next tells
        self._silent = {}

    async def stop(self, gang: Gang, grace_s: float) -> None:
        # One ping to each of the gang's nodes: one that does not answer is not waited for.
        nodes = sorted({launch.node for launch in gang.plan.ranks})
        away: Away = asyncio.ensure_future(self.answers.away(nodes))
        try:
            await asyncio.gather(stop_gang(gang, grace_s, away),
                                 unwatch_links(self.links, away), self._unwatch_more())
            found = away.done() and not away.cancelled() and not away.exception()
            self._silent = away.result() if found else {}
        finally:
            away.cancel()

    async def away(self, nodes: list[str]) -> dict[str, str]:
        """The nodes away; those silent at the stop just now are not pinged again (a frozen
        node would cost another ping's wait)."""
        known, self._silent = self._silent, {}
        return {n: why for n, why in known.items() if n in nodes} or await self.answers.away(nodes)


async def stop_gang(gang: Gang, grace_s: float, away: Away | None = None) -> None:
    """SIGTERM every rank, SIGKILL after grace_s; then ask the nodes for leftovers and kill
    them. Returns within about grace_s + 2 x STOP_ANSWER_S + LEFTOVERS_S, or as soon as
    the only ranks still running are on the nodes found `away`."""
    stopping = asyncio.ensure_future(gang.stop(grace_s))
    try:
        if not await _stopped(gang, stopping, grace_s + STOP_ANSWER_S, away):
            # Asking that node for leftovers would only wait as long again.
            log.warning("a node did not confirm its ranks' stop (away?): they are ended by "
                        "PID once it answers again")
            return
    finally:
        stopping.cancel()
    try:
        leftovers = await asyncio.wait_for(gang.leftovers(), LEFTOVERS_S)
    except TimeoutError:
        return
    if leftovers:
        log.error("ranks still running after stop: %s; killing", ", ".join(leftovers))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(gang.stop(0.0), STOP_ANSWER_S)


async def _stopped(gang: Gang, stopping: asyncio.Future[None], limit_s: float,
                   away: Away | None) -> bool:
    """True once the stop request is answered on every node; False once the only ranks
    still running are on nodes away, or past limit_s."""
    deadline = asyncio.get_running_loop().time() + limit_s
    try:
        silent = await _silent(stopping, away, limit_s)
        while silent and not stopping.done() and _left(deadline) > 0 and any(
            p.running and p.node not in silent for p in gang.ranks.values()
        ):
            await asyncio.sleep(CONFIRMED_POLL_S)
        if not silent or stopping.done():
            await asyncio.wait_for(asyncio.shield(stopping), _left(deadline))
            return True
        return False
    except TimeoutError:
        return False


async def _silent(work: asyncio.Future[None], away: Away | None, limit_s: float) -> set[str]:
    """The nodes away, once known before `work` is done (else none); TimeoutError past
    limit_s."""
    if away is None:
        return set()
    await asyncio.wait_for(first_done(asyncio.shield(work), asyncio.shield(away)), limit_s)
    if work.done() or not away.done() or away.cancelled() or away.exception():
        return set()
    return set(away.result())


def _left(deadline: float) -> float:
    return max(0.0, deadline - asyncio.get_running_loop().time())


async def unwatch_links(links: Links | None, away: Away | None = None) -> None:
    """End the link probes; a node away does not hold it up (past STOP_ANSWER_S, or once
    it did not answer the ping sent with the stop: the others answered long before)."""
    if links is None:
        return
    unwatching = asyncio.ensure_future(links.unwatch())
    try:
        if not await _silent(unwatching, away, STOP_ANSWER_S):
            await asyncio.wait_for(asyncio.shield(unwatching), STOP_ANSWER_S)
    except TimeoutError:
        pass
    finally:
        unwatching.cancel()
