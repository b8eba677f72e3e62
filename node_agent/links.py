"""The node's side of the links between ranks: reachability checks and a link watch.

Before a launch the orchestrator asks the node a rank will listen on to `listen` on that
address and port, and the node that will connect to it to `connect`: a blocked cable is
named in seconds instead of surfacing as an init timeout. While a gang runs, `watch`
probes each link the node's rank connects over once a second. A probe is a TCP connect
to the peer rank's port: an accept or a refusal (the rank closed its listener once the
ring formed) both prove packets flow; silence past the timeout does not.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable

from contract.agent_protocol import LinkState, LinkTarget, Message, Reachable

log = logging.getLogger("node_agent.links")

Emit = Callable[[Message], Awaitable[None]]


class LinkProbes:
    def __init__(self, emit: Emit) -> None:
        self._emit = emit
        self._servers: dict[tuple[str, int], asyncio.Server] = {}
        self._watch: asyncio.Task[None] | None = None
        # Each watch's number: a probe loop whose cancellation was lost (it raced the
        # probe's own end, as after a host slept) sees it is not current and stops, rather
        # than probing a port the next gang's rank is about to accept on.
        self._generation = 0

    async def listen(self, host: str, port: int) -> None:
        """Raises OSError when the address cannot be bound (not this node's, or taken)."""
        if (host, port) in self._servers:
            return

        async def hang_up(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            writer.close()

        self._servers[(host, port)] = await asyncio.start_server(
            hang_up, host, port, reuse_address=True
        )

    async def unlisten(self, host: str, port: int) -> None:
        server = self._servers.pop((host, port), None)
        if server is not None:
            server.close()
            await server.wait_closed()

    async def watch(
        self, targets: list[LinkTarget], interval_s: float, timeout_s: float, down_after: int
    ) -> None:
        """Replace the current watch (none when targets is empty)."""
        self._generation += 1
        if self._watch is not None:
            self._watch.cancel()
            self._watch = None
        if targets:
            self._watch = asyncio.create_task(
                self._watch_all(targets, interval_s, timeout_s, down_after)
            )

    async def close(self) -> None:
        await self.watch([], 0, 0, 0)
        for host, port in list(self._servers):
            await self.unlisten(host, port)

    async def _watch_all(
        self, targets: list[LinkTarget], interval_s: float, timeout_s: float, down_after: int
    ) -> None:
        await asyncio.gather(
            *(self._watch_one(t, interval_s, timeout_s, down_after) for t in targets)
        )

    async def _watch_one(
        self, target: LinkTarget, interval_s: float, timeout_s: float, down_after: int
    ) -> None:
        misses, up, generation = 0, True, self._generation
        while generation == self._generation:
            started = time.monotonic()
            error = await probe(target.host, target.port, timeout_s)
            misses = misses + 1 if error else 0
            went_down = up and misses >= down_after
            came_back = not up and error is None
            if went_down or came_back:
                up = came_back
                log.warning("link to %s:%d %s", target.host, target.port,
                            "up" if up else f"down: {error}")
                await self._emit(LinkState(host=target.host, port=target.port, up=up,
                                           error=error or ""))
            await asyncio.sleep(max(interval_s - (time.monotonic() - started), 0.0))


async def probe(host: str, port: int, timeout_s: float) -> str | None:
    """None when host answers at all (accept or refusal), else why not."""
    result = await connect(host, port, timeout_s)
    return None if result.ok or result.refused else result.error


async def connect(host: str, port: int, timeout_s: float, req_id: int = 0) -> Reachable:
    started = time.monotonic()
    try:
        async with asyncio.timeout(timeout_s):  # 3.11's wait_for can swallow a cancellation
            _, writer = await asyncio.open_connection(host, port)
    except TimeoutError:
        return Reachable(id=req_id, ok=False, error=f"no answer within {timeout_s:g} s")
    except ConnectionRefusedError:
        return Reachable(id=req_id, ok=False, refused=True, error="connection refused")
    except OSError as exc:
        return Reachable(id=req_id, ok=False, error=exc.strerror or str(exc))
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return Reachable(id=req_id, ok=True, seconds=time.monotonic() - started)
