"""The agent's sessions: one orchestrator in control at a time, stdio first, then socket.

A session starts with the agent's Hello and lasts until its input reaches EOF, a write to
it fails, or its lease passes without a request; the agent is then told why (`on_end`:
True when it stops, and wants its last events sent on that session).

A socket connection is pending until its `Open` claims control (`claim`). It takes over
from the session in control when that one comes from the same orchestrator (it lost its
connection and reconnects: the node slept, a cable was cut; the old session may not see
its EOF for a long while, TCP retransmitting into a frozen host) or has let its lease
lapse; otherwise it is refused with agent_busy: two orchestrators never drive one gang.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from contract import agent_protocol as protocol
from contract.adoption import AGENT_BUSY
from contract.agent_protocol import ErrorReply
from contract.message import Message
from node_agent.channel.stdio import LineWriter

log = logging.getLogger("node_agent.sessions")

BUSY = "another orchestrator controls this agent now: stop it (or let it finish) first"


@dataclass(eq=False)
class Session:
    reader: asyncio.StreamReader
    writer: LineWriter
    opened: bool = False
    ended: bool = False
    owner: str = ""  # the orchestrator's id, from its Open
    lease_s: float | None = None
    last_request: float = field(default_factory=time.monotonic)
    last_request_wall: float = field(default_factory=time.time)
    tasks: set[asyncio.Task[None]] = field(default_factory=set)

    def run(self, coro: Coroutine[Any, Any, None]) -> None:
        """A task that ends with the session."""
        task = asyncio.create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def touch(self) -> None:
        self.last_request, self.last_request_wall = time.monotonic(), time.time()

    def lapsed(self) -> bool:
        """No request within its lease, by either clock: a Mac's monotonic clock stands
        still while it sleeps, the wall clock does not."""
        if not self.lease_s:
            return False
        idle = max(time.monotonic() - self.last_request, time.time() - self.last_request_wall)
        return idle > self.lease_s


class Sessions:
    def __init__(
        self,
        hello: Callable[[], Message],
        handle: Callable[[Session, bytes], Awaitable[None]],
        on_end: Callable[[str], bool],
    ) -> None:
        self._hello, self._handle, self._on_end = hello, handle, on_end
        self.current: Session | None = None
        self._pending: set[Session] = set()
        self.accepting = True

    async def send(self, session: Session | None, msg: Message) -> None:
        if session is None or session.writer.is_closing():
            return
        try:
            session.writer.write(protocol.encode(msg))
            await session.writer.drain()
        except (ConnectionError, RuntimeError) as exc:
            self.end(session, f"stdout closed ({exc})")

    def attach(self, session: Session) -> None:
        """The session in control from the start (the agent's stdio)."""
        self.current = session
        session.run(self._serve(session))

    async def on_client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """A socket connection: pending until its Open claims control."""
        if not self.accepting:
            with contextlib.suppress(ConnectionError, RuntimeError):
                writer.write(protocol.encode(ErrorReply(id=None, code=AGENT_BUSY, message=BUSY)))
                await writer.drain()
            writer.close()
            log.warning("refused an orchestrator connection: the agent is ending")
            return
        session = Session(reader, writer)
        self._pending.add(session)
        session.run(self._serve(session))

    def claim(self, session: Session, owner: str) -> str | None:
        """Give `session` control, taking over a stale one; the refusal's text if another
        orchestrator holds it."""
        held = self.current
        if held is session:
            session.owner = owner
            return None
        if held is not None and not held.ended:
            if owner and owner == held.owner:
                why = "its orchestrator reconnected"
            elif held.lapsed():
                why = f"no request for {held.lease_s:g} s (lease lapsed)"
            else:
                return BUSY
            log.warning("the session in control is replaced: %s", why)
            self._close(held)
        self._pending.discard(session)
        session.owner = owner
        self.current = session
        log.info("an orchestrator took control on the agent socket")
        return None

    async def _serve(self, session: Session) -> None:
        await self.send(session, self._hello())
        while not session.ended:
            try:
                line = await session.reader.readline()
            except (ValueError, asyncio.LimitOverrunError):
                too_long = ErrorReply(id=None, code=protocol.BAD_REQUEST,
                                      message="request line too long")
                await self.send(session, too_long)
                continue
            except ConnectionError:
                line = b""
            if not line:
                self.end(session, "stdin closed")
                return
            if line.strip():
                session.touch()
                await self._handle(session, line)

    def end(self, session: Session, reason: str) -> None:
        """The session is over; for the one in control, the agent decides what follows."""
        if session.ended:
            return
        if self.current is not session:  # pending, or replaced already
            self._close(session)
            return
        self.current = None
        session.ended = True
        for task in session.tasks:
            task.cancel()
        if self._on_end(reason):  # the agent stops: its last events go out on this session
            self.accepting = False
            self.current = session
        else:
            session.writer.close()

    def _close(self, session: Session) -> None:
        session.ended = True
        self._pending.discard(session)
        for task in session.tasks:
            task.cancel()
        session.writer.close()

    def start_lease(self, session: Session, lease_s: float) -> None:
        session.lease_s = lease_s
        session.run(self._lease_loop(session, lease_s))

    async def _lease_loop(self, session: Session, lease_s: float) -> None:
        """Sleeps until the lease could expire; no request within lease_s ends the session."""
        while True:
            remaining = session.last_request + lease_s - time.monotonic()
            if remaining <= 0:
                self.end(session, f"no request for {lease_s:g} s (lease expired)")
                return
            await asyncio.sleep(remaining)

    async def close(self) -> None:
        """Flush and close the open session, if any (the last exited events)."""
        self.accepting = False
        for pending in list(self._pending):
            self._close(pending)
        session, self.current = self.current, None
        if session is None:
            return
        session.writer.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(session.writer.wait_closed(), 5.0)
