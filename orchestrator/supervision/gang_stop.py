"""Stopping a gang in bounded time, also when one of its nodes is away.

A node asleep never confirms a stop: waiting for it would keep the cluster in `restarting`
for as long as the agent's lease (15 s) or the request's timeout. Its ranks stay recorded
as unconfirmed and are reaped by PID (launch id checked) before the next launch. While the
stop runs, the gang's nodes are asked to answer (a ping): once the ones that do not answer
are known and every rank elsewhere confirmed its stop, the stop is over, without waiting
the grace plus STOP_ANSWER_S for the silent ones (a re-plan ~4 s sooner).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from orchestrator.launch.gang import Gang
from orchestrator.supervision.interfaces import Answers, Links
from orchestrator.supervision.races import first_done

log = logging.getLogger(__name__)

STOP_ANSWER_S = 5.0  # past the ranks' grace, the most a node may take to confirm a stop
LEFTOVERS_S = 5.0
CONFIRMED_POLL_S = 0.1  # how often the ranks on the answering nodes are checked as stopped


async def stop_gang(gang: Gang, grace_s: float, answers: Answers | None = None) -> None:
    """SIGTERM every rank, SIGKILL after grace_s; then ask the nodes for leftovers and kill
    them. Returns within about grace_s + 2 x STOP_ANSWER_S + LEFTOVERS_S, or as soon as
    the nodes `answers` finds away are the only ones whose ranks still run."""
    stopping = asyncio.ensure_future(gang.stop(grace_s))
    try:
        if not await _stopped(gang, stopping, grace_s + STOP_ANSWER_S, answers):
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


async def _stopped(
    gang: Gang, stopping: asyncio.Future[None], limit_s: float, answers: Answers | None
) -> bool:
    """True once the stop request is answered on every node; False once the only ranks
    still running are on nodes that do not answer, or past limit_s."""
    deadline = asyncio.get_running_loop().time() + limit_s
    nodes = sorted({p.node for p in gang.ranks.values() if p.running})
    asking = asyncio.ensure_future(answers.away(nodes) if answers and nodes else _nothing())
    try:
        await asyncio.wait_for(first_done(asyncio.shield(stopping), asyncio.shield(asking)),
                               limit_s)
        away = set(asking.result()) if asking.done() and not asking.exception() else set()
        while away and not stopping.done() and _left(deadline) > 0 and any(
            p.running and p.node not in away for p in gang.ranks.values()
        ):
            await asyncio.sleep(CONFIRMED_POLL_S)
        if not away or stopping.done():
            await asyncio.wait_for(asyncio.shield(stopping), _left(deadline))
            return True
        return False
    except TimeoutError:
        return False
    finally:
        asking.cancel()


def _left(deadline: float) -> float:
    return max(0.0, deadline - asyncio.get_running_loop().time())


async def _nothing() -> dict[str, str]:
    return {}


async def unwatch_links(links: Links | None) -> None:
    """End the link probes; a node away does not hold it up."""
    if links is not None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(links.unwatch(), STOP_ANSWER_S)
