"""The agent's sessions: one orchestrator connection at a time, stdio first, then socket.

A session starts with the agent's Hello and lasts until its input reaches EOF, a write to
it fails, or its lease passes without a request; the agent is then told why (`on_end`:
True when it stops, and wants its last events sent on that session). A socket
connection that comes while a session is open is refused with an agent_busy error: two
orchestrators never drive one gang.
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
from node_agent.stdio import LineWriter

log = logging.getLogger("node_agent.sessions")

BUSY = "another orchestrator controls this agent now: stop it (or let it finish) first"


@dataclass(eq=False)
class Session:
    reader: asyncio.StreamReader
    writer: LineWriter
    opened: bool = False
    last_request: float = field(default_factory=time.monotonic)
    tasks: set[asyncio.Task[None]] = field(default_factory=set)

    def run(self, coro: Coroutine[Any, Any, None]) -> None:
        """A task that ends with the session."""
        task = asyncio.create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)


class Sessions:
    def __init__(
        self,
        hello: Callable[[], Message],
        handle: Callable[[Session, bytes], Awaitable[None]],
        on_end: Callable[[str], bool],
    ) -> None:
        self._hello, self._handle, self._on_end = hello, handle, on_end
        self.current: Session | None = None
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
        self.current = session
        session.run(self._serve(session))

    async def on_client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """A socket connection: the new session, unless one is open (refused, closed)."""
        if self.current is not None or not self.accepting:
            with contextlib.suppress(ConnectionError, RuntimeError):
                writer.write(protocol.encode(ErrorReply(id=None, code=AGENT_BUSY, message=BUSY)))
                await writer.drain()
            writer.close()
            log.warning("refused an orchestrator connection: another one is open")
            return
        log.info("an orchestrator connected on the agent socket")
        self.attach(Session(reader, writer))

    async def _serve(self, session: Session) -> None:
        await self.send(session, self._hello())
        while self.current is session:
            try:
                line = await session.reader.readline()
            except (ValueError, asyncio.LimitOverrunError):
                too_long = "request line too long"
                await self.send(session, ErrorReply(id=None, code="bad_request", message=too_long))
                continue
            except ConnectionError:
                line = b""
            if not line:
                self.end(session, "stdin closed")
                return
            if line.strip():
                session.last_request = time.monotonic()
                await self._handle(session, line)

    def end(self, session: Session, reason: str) -> None:
        if self.current is not session:
            return
        self.current = None
        for task in session.tasks:
            task.cancel()
        if self._on_end(reason):  # the agent stops: its last events go out on this session
            self.accepting = False
            self.current = session
        else:
            session.writer.close()

    def start_lease(self, session: Session, lease_s: float) -> None:
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
        session, self.current = self.current, None
        if session is None:
            return
        session.writer.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(session.writer.wait_closed(), 5.0)
