"""The agent's main loop: read requests from its orchestrator, answer, push events.

The orchestrator's session is stdin/stdout (the SSH channel, the local pipes) at first;
with --socket, later ones arrive on a Unix socket (node_agent/channel/unix_socket.py), one
at a time: a connection while another is open is refused (agent_busy).

A session ends when its input reaches EOF (SSH channel lost, orchestrator gone), a write
fails, or the lease set by `Open` expires without a request. Then, if the orchestrator
set orphan_grace_s and ranks run, the ranks serve on and the agent waits that long for
an orchestrator to adopt them (node_agent/orphan.py); otherwise, and on SIGTERM or
SIGINT, it stops every rank (SIGTERM to its group, SIGKILL after the grace period) and
exits. An Open of another protocol version ends the ranks too (exit code 3).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import socket
import sys
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import msgspec

from contract import agent_protocol as protocol
from contract.adoption import AGENT_BUSY
from contract.agent_protocol import (
    PROTOCOL_VERSION,
    ErrorReply,
    Hello,
    Message,
    Ok,
    Open,
    Request,
)
from node_agent import AGENT_VERSION
from node_agent.agent_requests import error_reply, safe_digest
from node_agent.channel import unix_socket
from node_agent.channel.sessions import Session, Sessions, Terms
from node_agent.channel.stdio import LineWriter, open_protocol_stdio
from node_agent.code_digest import code_root
from node_agent.handlers import Handlers, Route
from node_agent.links import LinkProbes
from node_agent.orphan import OrphanGrace, log_to_file
from node_agent.ranks import RankTable
from node_agent.usage import UsageReporter

log = logging.getLogger("node_agent")

EXIT_OK = 0
EXIT_PROTOCOL_MISMATCH = 3
EXIT_SOCKET = 5  # another agent has the socket, or it cannot be trusted
REQUEST_LINE_LIMIT = 16 << 20


class Agent:
    def __init__(self, grace_s: float, socket_path: str | None = None) -> None:
        self._grace_s = grace_s
        self._socket_path = socket_path
        self._server: asyncio.Server | None = None
        self._socket: Path | None = None
        self._root = code_root()
        self._ranks = RankTable(self.emit, self._root)
        self._links = LinkProbes(self.emit)
        self._usage = UsageReporter(self.emit, self._ranks.pids)
        self._sessions = Sessions(self._hello, self._handle_line, self._session_ended)
        self._orphan = OrphanGrace(self.shutdown)
        self._stdio: Session | None = None  # the session the agent was started with
        self._stop = asyncio.Event()
        self._stop_reason = ""
        self._exit_code = EXIT_OK
        self._tasks: set[asyncio.Task[None]] = set()
        self._handlers = Handlers(self._ranks, self._links, self._usage, self._orphan)
        self._routes = self._handlers.table()

    async def emit(self, msg: Message) -> None:
        """Push to the open session; nobody hears it while the agent is orphaned."""
        await self._sessions.send(self._sessions.current, msg)

    def shutdown(self, reason: str, exit_code: int = EXIT_OK) -> None:
        if not self._stop.is_set():
            self._stop_reason = reason
            self._exit_code = exit_code
            self._stop.set()

    def on_sighup(self) -> None:
        """sshd may hang up with the channel: a gang kept for an adopter ignores it."""
        if self._sessions.terms.orphan_grace_s > 0 and len(self._ranks):
            log.info("SIGHUP ignored: the ranks serve on for orphan_grace_s")
        else:
            self.shutdown("received SIGHUP")

    async def run(self, reader: asyncio.StreamReader, writer: LineWriter) -> int:
        self._handlers.digest = await asyncio.to_thread(safe_digest, self._root)
        if self._socket_path:
            try:
                self._server, self._socket = await unix_socket.serve(
                    self._socket_path, self._sessions.on_client
                )
            except (unix_socket.SocketRefused, OSError) as exc:
                log.error("cannot listen on the agent socket: %s", exc)
                return EXIT_SOCKET
        self._stdio = Session(reader, writer)
        self._sessions.attach(self._stdio)
        await self._stop.wait()
        log.info("shutting down: %s", self._stop_reason)
        self._sessions.accepting = False  # a connection now is told: busy (ending)
        await self._links.close()
        self._usage.stop()
        self._ranks.discard_standbys()
        if len(self._ranks):
            await self._ranks.stop(None, self._grace_s)
        if self._server is not None:  # gone with the ranks: the next agent may take it
            self._server.close()
            if self._socket is not None:
                self._socket.unlink(missing_ok=True)
        for task in list(self._tasks):
            task.cancel()
        await self._sessions.close()
        return self._exit_code

    def _session_ended(self, reason: str) -> bool:
        """The orchestrator is gone: keep the gang for an adopter (False), or stop (True)."""
        grace_s = self._sessions.terms.orphan_grace_s
        if not (grace_s > 0 and len(self._ranks) and self._server is not None):
            self.shutdown(reason)
            return True
        if self._socket is not None:  # first: stderr was the closed SSH channel's
            log_to_file(self._socket.with_suffix(".log"))
        log.warning("%s: the ranks serve on, up to %g s for an orchestrator to adopt them",
                    reason, grace_s)
        self._spawn_task(self._drop_session_state())
        self._orphan.begin(grace_s)
        return False

    def _spawn_task(self, coro: Coroutine[Any, Any, None]) -> None:
        """A task the agent cancels when it shuts down."""
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _drop_session_state(self) -> None:
        """What an ended session asked for stops with it: its standbys, usage reports, and
        link probes and listeners (a probe left running would connect to the next gang's
        ring port before its rank does, and hang the ring's init)."""
        self._ranks.discard_standbys()
        self._usage.stop()
        await self._links.close()

    def _hello(self) -> Hello:
        return Hello(
            agent_version=AGENT_VERSION,
            protocol_version=PROTOCOL_VERSION,
            pid=os.getpid(),
            hostname=socket.gethostname(),
            python=sys.executable,
            code_digest=self._handlers.digest,
        )

    async def _handle_line(self, session: Session, line: bytes) -> None:
        try:
            req = protocol.decode_request(line)
        except msgspec.DecodeError as exc:
            reply = ErrorReply(id=protocol.salvage_id(line), code=protocol.BAD_REQUEST,
                               message=f"cannot decode request: {exc}")
            await self._sessions.send(session, reply)
            return
        if isinstance(req, Open):
            await self._open(session, req)
        elif not session.opened:
            await self._sessions.send(session, ErrorReply(
                id=req.id, code=protocol.HANDSHAKE_REQUIRED,
                message="send `open` with the protocol version first"))
        elif (route := self._routes.get(type(req))) is None:
            raise AssertionError(f"no handler for request {req!r}")
        elif route.waits:  # answered out of order: the session keeps reading meanwhile
            self._spawn_task(self._dispatch(session, req, route))
        else:
            await self._dispatch(session, req, route)

    async def _open(self, session: Session, req: Open) -> None:
        if req.protocol_version != PROTOCOL_VERSION:
            await self._sessions.send(session, ErrorReply(
                id=req.id, code=protocol.PROTOCOL_MISMATCH,
                message=f"this agent (version {AGENT_VERSION}, at {self._root}) speaks protocol "
                f"{PROTOCOL_VERSION}, the orchestrator speaks {req.protocol_version}: "
                "its ranks are ended; deploy the orchestrator's own node_agent code"))
            self.shutdown("protocol version mismatch", EXIT_PROTOCOL_MISMATCH)
            return
        if session.opened:
            await self._sessions.send(session, ErrorReply(
                id=req.id, code=protocol.BAD_REQUEST, message="the session is already open"))
            return
        held = self._sessions.current
        refused = self._sessions.claim(session, Terms.of(req))
        if refused is not None:
            await self._sessions.send(session, ErrorReply(id=req.id, code=AGENT_BUSY,
                                                          message=refused))
            self._sessions.end(session, "refused")
            return
        if held is not None and held is not session:  # taken over: as if it had ended
            await self._drop_session_state()
        if self._socket is not None and session is not self._stdio:
            log_to_file(self._socket.with_suffix(".log"))  # stderr is a lost channel's now
        self._orphan.pause()
        await self._sessions.send(session, Ok(id=req.id))

    async def _dispatch(self, session: Session, req: Request, route: Route) -> None:
        try:
            reply = await route.handle(req)
        except Exception as exc:
            reply = error_reply(req, exc)
        await self._sessions.send(session, reply)  # only to the session that asked


async def _amain(grace_s: float, socket_path: str | None) -> int:
    reader, writer = await open_protocol_stdio(REQUEST_LINE_LIMIT)
    agent = Agent(grace_s, socket_path)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, agent.shutdown, f"received {sig.name}")
    loop.add_signal_handler(signal.SIGHUP, agent.on_sighup)
    return await agent.run(reader, writer)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m node_agent",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--grace",
        type=float,
        default=5.0,
        help="seconds between SIGTERM and SIGKILL when the agent shuts down",
    )
    parser.add_argument(
        "--socket",
        help="Unix socket where later orchestrators reach this agent (\"~\" is expanded)",
    )
    parser.add_argument(
        "--version",
        action="version",
        version=f"node_agent {AGENT_VERSION} (protocol {PROTOCOL_VERSION})",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(
        stream=sys.stderr,
        level=logging.INFO,
        format=f"node_agent[{os.getpid()}] %(levelname)s %(message)s",
    )
    return asyncio.run(_amain(args.grace, args.socket))
