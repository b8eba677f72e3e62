"""The node's side of the links between ranks: reachability checks and a link watch.

Before a launch the orchestrator asks the node a rank will listen on to `listen` on that
address and port, and the node that will connect to it to `connect`: a blocked cable is
named in seconds instead of surfacing as an init timeout. While a gang runs, `watch`
probes each link the node's rank connects over once a second. A probe is a TCP connect
to the peer rank's port: an accept or a refusal (the rank closed its listener once the
ring formed) both prove packets flow; silence past the timeout does not.

A probe's answer window (WatchLinks.timeout_s, 1.5 s) outlasts TCP's first SYN
retransmission (1 s on Linux and macOS), so one lost packet costs no probe; the probes
overlap (one starts each second, whatever the last one's fate) so that the wider window
does not slow the probing. A link is down after `down_after` probes in a row missed (two:
a loss shorter than 2 s is ridden out; a dead link is noticed within 1 + 1 + 1.5 s). With a
1 s window and one probe after the other, a loss just over 1 s (a SYN dropped by a full
queue, then its retransmission's slot) could already take the link down.
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


class LinkHealth:
    """The down / up rule of one link, from its probes' verdicts as they come (an older
    probe's miss can come after a newer one's answer: it no longer counts)."""

    def __init__(self, down_after: int) -> None:
        self.down_after = down_after
        self.up = True
        self._started = 0  # probes started, numbered from 1
        self._answered = 0  # the newest probe answered

    def start(self) -> int:
        """A probe starts: its number."""
        self._started += 1
        return self._started

    def answered(self, number: int) -> bool:
        """Probe `number` was answered; True when the link just came back up."""
        self._answered = max(self._answered, number)
        came_back, self.up = not self.up, True
        return came_back

    def missed(self, number: int) -> bool:
        """Probe `number` got no answer in its window; True when the link just went down.
        Every probe started between the newest answered one and this one missed too: their
        windows, as long and opened earlier, closed first."""
        went_down = self.up and number - self._answered >= self.down_after
        self.up = self.up and not went_down
        return went_down


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
        """A probe every interval_s, each with its own timeout_s window (they overlap); the
        probes in flight end with the watch."""
        health, generation, emitting = LinkHealth(down_after), self._generation, asyncio.Lock()
        async with asyncio.TaskGroup() as probes:
            while generation == self._generation:
                number = health.start()
                probes.create_task(
                    self._probe_once(target, timeout_s, health, number, generation, emitting)
                )
                await asyncio.sleep(interval_s)

    async def _probe_once(
        self, target: LinkTarget, timeout_s: float, health: LinkHealth, number: int,
        generation: int, emitting: asyncio.Lock,
    ) -> None:
        error = await probe(target.host, target.port, timeout_s)
        changed = health.missed(number) if error else health.answered(number)
        if not changed or generation != self._generation:
            return
        log.warning("link to %s:%d %s", target.host, target.port,
                    f"down: {error}" if error else "up")
        async with emitting:  # a lock is FIFO: the changes are sent in the order they came
            await self._emit(LinkState(host=target.host, port=target.port, up=error is None,
                                       error=error or ""))


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
