"""AgentHandle: the orchestrator's side of one running node agent.

    transport ── starts ──▶ agent process ── stdout lines ──▶ _read_loop ─┬─▶ pending[id] (replies)
                                ▲                                          └─▶ on_event
    request(msg) ── stdin line ─┘

The channel under it (a local pipe or an SSH exec channel) is an `AgentChannel`.
`finished` resolves with an `AgentExit` when the channel closes for any reason;
every pending request then fails with TransportError(AGENT_LOST).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

import msgspec

from contract import agent_protocol as protocol
from contract.adoption import AGENT_BUSY, Adopt
from contract.agent_protocol import (
    PROTOCOL_VERSION,
    CheckPorts,
    ErrorReply,
    Event,
    Exited,
    Fingerprint,
    FingerprintResult,
    Hello,
    ListRanks,
    Ok,
    Open,
    Ping,
    Pong,
    PortsResult,
    RankInfo,
    RankList,
    Reap,
    Reaped,
    Reply,
    Request,
    Spawn,
    Spawned,
    Stop,
    Stopped,
)
from contract.fingerprint import NodeFingerprint
from orchestrator.transports.errors import AgentRequestError, ErrorKind, TransportError

log = logging.getLogger("orchestrator.transports")

R = TypeVar("R", bound=Reply)
STDERR_TAIL = 50
DEFAULT_LEASE_S = 15.0


class AgentChannel(Protocol):
    """Byte streams to one agent process and control over its life."""

    async def readline(self) -> bytes: ...  # b"" at EOF
    async def send(self, data: bytes) -> None: ...
    def close_stdin(self) -> None: ...  # the agent stops its ranks and exits
    async def wait_exit(self) -> int | None: ...  # exit status once the process is gone
    def kill(self) -> None: ...  # last resort: end the agent process / channel now
    def stderr_tail(self) -> list[str]: ...


@dataclass
class StderrCollector:
    """Keeps the agent's last stderr lines and logs them under the node's name."""

    node: str
    lines: deque[str] = field(default_factory=lambda: deque(maxlen=STDERR_TAIL))

    async def collect(self, readline: Callable[[], Awaitable[bytes]]) -> None:
        while True:
            try:
                raw = await readline()
            except Exception:  # the channel is gone: the read loop reports why
                return
            if not raw:
                return
            line = raw.decode("utf-8", errors="replace").rstrip("\r\n")
            self.lines.append(line)
            log.info("[%s] %s", self.node, line)


@dataclass(frozen=True)
class AgentExit:
    reason: str
    exit_status: int | None
    stderr_tail: list[str]


class AgentHandle:
    """Requests, events and lifetime of one node's agent.

    Use `async with` or call `close()`: closing sends EOF on the agent's stdin,
    which makes the agent stop every rank (SIGTERM, then SIGKILL) and exit.
    """

    def __init__(
        self,
        node: str,
        channel: AgentChannel,
        *,
        on_event: Callable[[Event], None] | None = None,
        lease_s: float | None = DEFAULT_LEASE_S,
        orphan_grace_s: float = 0.0,
        orchestrator_id: str = "",
        attached: bool = False,
        end_other_versions: bool = True,
    ) -> None:
        self.node = node
        self.attached = attached  # reached on its socket: an agent a previous run left
        self._end_other_versions = end_other_versions
        self.hello: Hello | None = None
        self._channel = channel
        self._on_event = on_event
        self._lease_s = lease_s
        self._orphan_grace_s = orphan_grace_s
        self._orchestrator_id = orchestrator_id
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[Reply]] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self.finished: asyncio.Future[AgentExit] = asyncio.get_running_loop().create_future()

    @property
    def closed(self) -> bool:
        return self.finished.done()

    # ── lifecycle ──

    async def start(self, timeout: float = 30.0) -> Hello:
        """Wait for the agent's Hello, check the protocol, open the session."""
        try:
            line = await asyncio.wait_for(self._channel.readline(), timeout)
        except TimeoutError:
            raise self._start_error(
                ErrorKind.AGENT_START, f"the agent sent nothing within {timeout:g} s"
            ) from None
        if not line:
            raise await self._start_failure()
        try:
            first = protocol.decode_agent_message(line)
        except msgspec.DecodeError:
            raise self._start_error(
                ErrorKind.PROTOCOL, f"expected the agent's hello, got {line[:200]!r}"
            ) from None
        if isinstance(first, ErrorReply) and first.code == AGENT_BUSY:
            raise self._start_error(ErrorKind.AGENT_BUSY, f"its agent refused us: {first.message}")
        if not isinstance(first, Hello) or first.protocol_version != PROTOCOL_VERSION:
            got = first.protocol_version if isinstance(first, Hello) else type(first).__name__
            message = f"the agent speaks protocol {got}, this orchestrator {PROTOCOL_VERSION}"
            if isinstance(first, Hello) and self.attached and self._end_other_versions:
                # Open's version field is frozen: any agent ends its ranks and exits on it.
                await self._channel.send(protocol.encode(Open(protocol_version=PROTOCOL_VERSION)))
                message += f"; its gang (agent pid {first.pid}) is ended, to be relaunched"
            elif isinstance(first, Hello) and self.attached:
                message += (f" (agent {first.agent_version}, pid {first.pid}): left running; "
                            "`up` or `down` of this version ends it")
            raise self._start_error(ErrorKind.PROTOCOL, message)
        self.hello = first
        self._tasks.append(asyncio.create_task(self._read_loop(), name=f"agent-{self.node}"))
        opening = Open(
            protocol_version=PROTOCOL_VERSION,
            lease_s=self._lease_s,
            orphan_grace_s=self._orphan_grace_s,
            orchestrator_id=self._orchestrator_id,
        )
        try:
            await self.request(opening, Ok, timeout)
        except AgentRequestError as exc:
            await self.close()
            if exc.code == AGENT_BUSY:
                raise TransportError(self.node, ErrorKind.AGENT_BUSY,
                                     f"its agent refused us: {exc.message}") from None
            raise TransportError(self.node, ErrorKind.PROTOCOL, exc.message) from None
        if self._lease_s:
            self._tasks.append(asyncio.create_task(self._ping_loop(self._lease_s)))
        return first

    def _start_error(self, kind: ErrorKind, message: str) -> TransportError:
        """The agent is unusable before its session began: end it and say why."""
        self._channel.kill()
        self._finish(message)
        return TransportError(self.node, kind, message)

    async def _start_failure(self) -> TransportError:
        try:
            status = await asyncio.wait_for(self._channel.wait_exit(), 5.0)
        except TimeoutError:
            status = None
        tail = "\n  ".join(self._channel.stderr_tail()[-10:]) or "(no output)"
        message = f"the agent exited before its hello (exit status {status}):\n  {tail}"
        if status == 127:  # the shell found no such program: python, or a venv not made yet
            message += "\n  its python is missing: `orchestrator bootstrap cluster.toml` makes "
            message += "a node's venv, or set python to an interpreter the node has"
        self._finish(message, status)
        return TransportError(self.node, ErrorKind.AGENT_START, message)

    async def close(self, timeout: float = 30.0) -> AgentExit:
        """EOF to the agent (it stops its ranks and exits), then wait; kill after timeout."""
        if not self.finished.done():
            with contextlib.suppress(Exception):
                self._channel.close_stdin()
            try:
                await asyncio.wait_for(asyncio.shield(self.finished), timeout)
            except TimeoutError:
                log.warning(
                    "[%s] agent did not exit %g s after EOF; killing its channel",
                    self.node,
                    timeout,
                )
                self._channel.kill()
                self._finish("closed (killed after timeout)")
        for task in self._tasks:
            task.cancel()
        # Reap the process (a killed one too) so nothing is left half-closed.
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._channel.wait_exit(), 5.0)
        return await self.finished

    async def __aenter__(self) -> AgentHandle:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # ── requests ──

    async def request(self, msg: Request, expect: type[R], timeout: float | None = None) -> R:
        """Send msg with a fresh id and return its reply, checked to be `expect`."""
        if self.finished.done():
            raise TransportError(self.node, ErrorKind.AGENT_LOST, self.finished.result().reason)
        req_id = next(self._ids)
        msg = msgspec.structs.replace(msg, id=req_id)
        fut: asyncio.Future[Reply] = asyncio.get_running_loop().create_future()
        self._pending[req_id] = fut
        try:
            try:
                await self._channel.send(protocol.encode(msg))
            except Exception as exc:  # BrokenPipe, asyncssh's channel errors...
                raise TransportError(
                    self.node, ErrorKind.AGENT_LOST, f"cannot write to the agent: {exc!r}"
                ) from exc
            # A timeout raises TimeoutError: the agent may be slow, not gone.
            reply = await asyncio.wait_for(fut, timeout)
        finally:
            self._pending.pop(req_id, None)
        if isinstance(reply, ErrorReply):
            raise AgentRequestError(self.node, reply.code, reply.message)
        if not isinstance(reply, expect):
            raise TransportError(
                self.node, ErrorKind.PROTOCOL, f"expected {expect.__name__}, got {reply!r}"
            )
        return reply

    async def fingerprint(
        self, model: str | None = None, timeout: float = 120.0
    ) -> NodeFingerprint:
        return (
            await self.request(Fingerprint(model=model), FingerprintResult, timeout)
        ).fingerprint

    async def spawn(self, request: Spawn, timeout: float = 30.0) -> Spawned:
        """Start a rank process (or adopt its standby); returns its pid."""
        return await self.request(request, Spawned, timeout)

    async def stop(self, rank: int | None = None, grace_s: float = 10.0) -> list[Exited]:
        """Stop one rank (or all); returns their exits once they are gone."""
        reply = await self.request(Stop(rank=rank, grace_s=grace_s), Stopped, grace_s + 30.0)
        return reply.exits

    async def ports_in_use(self, host: str, ports: list[int], timeout: float = 10.0) -> list[int]:
        """Which of these ports cannot be bound on host of this node right now."""
        return (await self.request(CheckPorts(host=host, ports=ports), PortsResult, timeout)).in_use

    async def reap(self, pid: int, launch_id: str, grace_s: float = 5.0) -> bool:
        """End a leftover process of launch_id by PID; False if it is gone or not ours."""
        reply = await self.request(
            Reap(pid=pid, launch_id=launch_id, grace_s=grace_s), Reaped, grace_s + 30.0
        )
        return reply.killed

    async def rdma_holders(self, timeout: float = 30.0) -> list[protocol.RdmaHolder]:
        """The processes that hold (or, running JACCL, may hold) the node's RDMA devices."""
        reply = await self.request(protocol.FindRdmaHolders(), protocol.RdmaHolders, timeout)
        return reply.holders

    async def ping(self, timeout: float = 10.0) -> Pong:
        return await self.request(Ping(), Pong, timeout)

    async def list_ranks(self, timeout: float = 10.0) -> list[RankInfo]:
        return (await self.launch_state(timeout)).ranks

    async def launch_state(self, timeout: float = 10.0) -> RankList:
        """The ranks, their launch record and since when no orchestrator had them."""
        return await self.request(ListRanks(), RankList, timeout)

    async def adopt(self, launch_id: str, timeout: float = 10.0) -> None:
        """We supervise the agent's gang from now on: its orphan grace ends."""
        await self.request(Adopt(launch_id=launch_id), Ok, timeout)

    async def listen(self, host: str, port: int, timeout: float = 10.0) -> None:
        """Accept TCP connections on host:port of the node (AgentRequestError bind_failed)."""
        await self.request(protocol.Listen(host=host, port=port), Ok, timeout)

    async def unlisten(self, host: str, port: int, timeout: float = 10.0) -> None:
        await self.request(protocol.Unlisten(host=host, port=port), Ok, timeout)

    async def connect(self, host: str, port: int, timeout_s: float = 3.0) -> protocol.Reachable:
        """Whether the node can open a TCP connection to host:port."""
        msg = protocol.Connect(host=host, port=port, timeout_s=timeout_s)
        return await self.request(msg, protocol.Reachable, timeout_s + 10.0)

    async def wake(self, launch_id: str, timeout: float = 5.0) -> None:
        """End the idle sleep of this node's worker ranks of launch_id (SIGUSR2)."""
        await self.request(protocol.Wake(launch_id=launch_id), Ok, timeout)

    async def watch_usage(self, interval_s: float, timeout: float = 10.0) -> None:
        """Have the agent push a NodeUsage event every interval_s (0 stops it)."""
        await self.request(protocol.WatchUsage(interval_s=interval_s), Ok, timeout)

    async def watch_links(self, targets: list[protocol.LinkTarget], timeout: float = 10.0) -> None:
        """Probe these links from the node while the gang runs; LinkState events follow."""
        await self.request(protocol.WatchLinks(targets=targets), Ok, timeout)

    # ── internals ──

    async def _read_loop(self) -> None:
        reason = "the agent's channel closed"
        try:
            while True:
                line = await self._channel.readline()
                if not line:
                    break
                self._dispatch(line)
        except Exception as exc:  # any transport's way of saying "connection lost"
            reason = f"the agent's channel failed: {exc!r}"
        status: int | None = None
        with contextlib.suppress(TimeoutError, Exception):
            status = await asyncio.wait_for(self._channel.wait_exit(), 5.0)
        self._finish(reason, status)

    def _dispatch(self, line: bytes) -> None:
        try:
            msg = protocol.decode_agent_message(line)
        except msgspec.DecodeError as exc:
            log.warning("[%s] undecodable line from agent (%s): %r", self.node, exc, line[:200])
            return
        if isinstance(msg, protocol.Event):
            self._deliver(msg)
            return
        fut = self._pending.get(msg.id) if msg.id is not None else None
        if fut is not None and not fut.done():
            fut.set_result(msg)
        elif isinstance(msg, ErrorReply):
            log.warning("[%s] agent error: %s: %s", self.node, msg.code, msg.message)

    def _deliver(self, event: Event) -> None:
        if self._on_event is None:
            return
        try:
            self._on_event(event)
        except Exception:
            log.exception("[%s] on_event callback failed", self.node)

    async def _ping_loop(self, lease_s: float) -> None:
        """Renews the agent's lease; an agent that stops answering is treated as lost."""
        while not self.finished.done():
            await asyncio.sleep(lease_s / 3)
            try:
                await self.ping(timeout=lease_s)
            except TransportError:
                return
            except TimeoutError:
                log.warning("[%s] agent did not answer a ping within %g s", self.node, lease_s)
                self._channel.kill()
                self._finish(f"the agent did not answer a ping within {lease_s:g} s")
                return

    def _finish(self, reason: str, status: int | None = None) -> None:
        if self.finished.done():
            return
        self.finished.set_result(AgentExit(reason, status, self._channel.stderr_tail()))
        lost = TransportError(self.node, ErrorKind.AGENT_LOST, reason)
        for fut in self._pending.values():
            if not fut.done():
                fut.set_exception(lost)
