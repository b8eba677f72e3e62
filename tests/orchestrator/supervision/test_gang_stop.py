"""The end of a failed gang's link probes: a node that did not answer the stop's ping is
not waited for."""

from __future__ import annotations

import asyncio

from orchestrator.supervision.gang_stop import STOP_ANSWER_S, unwatch_links


class SilentLinks:
    """The probes' end is never confirmed (the node's agent is frozen)."""

    async def check(self) -> list[object]:
        return []

    async def watch(self) -> None: ...

    async def unwatch(self) -> None:
        await asyncio.Event().wait()


async def test_the_probes_end_is_not_waited_for_on_a_node_that_did_not_answer() -> None:
    """c did not answer the ping: unwatch_links returns at once, not after STOP_ANSWER_S."""
    away: asyncio.Future[dict[str, str]] = asyncio.get_running_loop().create_future()
    away.set_result({"c": "its agent did not answer within 3 s"})
    await asyncio.wait_for(unwatch_links(SilentLinks(), away), STOP_ANSWER_S / 5)  # type: ignore[arg-type]


async def test_the_probes_end_is_waited_for_while_every_node_answers() -> None:
    """Every node answered: the end of the probes is waited for (up to STOP_ANSWER_S)."""
    away: asyncio.Future[dict[str, str]] = asyncio.get_running_loop().create_future()
    away.set_result({})
    unwatching = asyncio.ensure_future(unwatch_links(SilentLinks(), away))  # type: ignore[arg-type]
    await asyncio.sleep(0.3)
    assert not unwatching.done()
    unwatching.cancel()
