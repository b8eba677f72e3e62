"""Stopping a gang in bounded time, also when one of its nodes is away.

A node asleep never confirms a stop: waiting for it would keep the cluster in `restarting`
for as long as the agent's lease (15 s) or the request's timeout. Its ranks stay recorded
as unconfirmed and are reaped by PID (launch id checked) before the next launch.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from orchestrator.launch.gang import Gang
from orchestrator.supervision.interfaces import Links

log = logging.getLogger(__name__)

STOP_ANSWER_S = 5.0  # past the ranks' grace, the most a node may take to confirm a stop
LEFTOVERS_S = 5.0


async def stop_gang(gang: Gang, grace_s: float) -> None:
    """SIGTERM every rank, SIGKILL after grace_s; then ask the nodes for leftovers and kill
    them. Returns within about grace_s + 2 x STOP_ANSWER_S + LEFTOVERS_S."""
    try:
        await asyncio.wait_for(gang.stop(grace_s), grace_s + STOP_ANSWER_S)
    except TimeoutError:
        # Asking that node for leftovers would only wait as long again.
        log.warning("a node did not confirm its ranks' stop within %g s (away?): they are "
                    "ended by PID once it answers again", grace_s + STOP_ANSWER_S)
        return
    try:
        leftovers = await asyncio.wait_for(gang.leftovers(), LEFTOVERS_S)
    except TimeoutError:
        return
    if leftovers:
        log.error("ranks still running after stop: %s; killing", ", ".join(leftovers))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(gang.stop(0.0), STOP_ANSWER_S)


async def unwatch_links(links: Links | None) -> None:
    """End the link probes; a node away does not hold it up."""
    if links is not None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(links.unwatch(), STOP_ANSWER_S)
