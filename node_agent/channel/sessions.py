"""The agent's sessions: one orchestrator in control at a time, stdio first, then socket.

A session starts with the agent's Hello and lasts until its input reaches EOF, a write to
it fails, or its lease passes without a request; the agent is then told why (`on_end`:
True when it stops, and wants its last events sent on that session).

A session's terms (its orchestrator, lease and orphan grace) are read once from its `Open`
(`Terms.of`) and given with the claim; the last claimed ones stay in force after their
session ends, for the agent to decide whether its gang serves on.

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
from contract.agent_protocol import ErrorReply, Open
from contract.message import Message
from node_agent.channel.stdio import LineWriter

log = logging.getLogger("node_agent.sessions")

BUSY = "another orchestrator controls this agent now: stop it (or let it finish) first"


@dataclass(frozen=True)
class Terms:
    """What an orchestrator's Open sets for its session."""

    owner: str = ""  # the orchestrator's id
    lease_s: float | None = None  # no request for that long ends the session
    orphan_grace_s: float = 0.0  # how long the ranks serve on once it has ended

    @classmethod
    def of(cls, req: Open) -> Terms:
        return cls(req.orchestrator_id, req.lease_s, req.orphan_grace_s)


@dataclass(eq=False)
class Session:
    reader: asyncio.StreamReader
    writer: LineWriter
    terms: Terms | None = None  # set by a successful claim: the session is open
    ended: bool = False
    last_request: float = field(default_factory=time.monotonic)
    last_request_wall: float = field(default_factory=time.time)
    tasks: set[asyncio.Task[None]] = field(default_factory=set)

    def run(self, coro: Coroutine[Any, Any, None]) -> None:
        """A task that ends with the session."""
        task = asyncio.create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    @property
    def opened(self) -> bool:
        return self.terms is not None

    def touch(self) -> None:
        self.last_request, self.last_request_wall = time.monotonic(), time.time()

    def lapsed(self) -> bool:
        """No request within its lease, by either clock: a Mac's monotonic clock stands
        still while it sleeps, the wall clock does not."""
        lease_s = self.terms.lease_s if self.terms else None
        if not lease_s:
            return False
        idle = max(time.monotonic() - self.last_request, time.time() - self.last_request_wall)
        return idle > lease_s


class Sessions:
    def __init__(
        self,
        hello: Callable[[], Message],
        handle: Callable[[Session, bytes], Awaitable[None]],
        on_end: Callable[[str], bool],
    ) -> None:
        self._hello, self._handle, self._on_end = hello, handle, on_end
        self.current: Session | None = None
        self.terms = Terms()  # the last claimed session's, kept once it has ended
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

    def claim(self, session: Session, terms: Terms) -> str | None:
        """Give `session` control on `terms`, taking over a stale one; the refusal's text
        if another orchestrator holds it."""
        held = self.current
        if held is not session:
            refused = self._take_over(held, terms.owner)
            if refused is not None:
                return refused
            self._pending.discard(session)
            self.current = session
            log.info("an orchestrator took control on the agent socket")
        session.terms = self.terms = terms
        if terms.lease_s:
            session.run(self._lease_loop(session, terms.lease_s))
        return None

    def _take_over(self, held: Session | None, owner: str) -> str | None:
        """Close the session in control for a new one; BUSY if it may not be replaced."""
        if held is None or held.ended:
            return None
        if held.terms is not None and owner and owner == held.terms.owner:
            why = "its orchestrator reconnected"
        elif held.terms is not None and held.lapsed():
            why = f"no request for {held.terms.lease_s:g} s (lease lapsed)"
        else:
            return BUSY
        log.warning("the session in control is replaced: %s", why)
        self._close(held)
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
