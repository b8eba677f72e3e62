"""The `ssh` transport: asyncssh connection, SFTP files (sftp_files.py), the agent on an
exec channel, and one exec channel per command for a node without an agent (bootstrap).

A dead link is noticed by SSH keepalives (keepalive_interval x
keepalive_count_max seconds) on this side and by the agent's stdin EOF or
lease on the node, which then stops its ranks.
"""

from __future__ import annotations

import asyncio
import contextlib

import asyncssh

from node_agent.channel import bridge
from orchestrator.config import NodeSpec
from orchestrator.transports.base import DEFAULT_CODE_CACHE, Completed, Transport, check_python
from orchestrator.transports.deploy import CodeBundle
from orchestrator.transports.errors import ErrorKind, TransportError
from orchestrator.transports.files import NodeFiles
from orchestrator.transports.handle import AgentChannel, StderrCollector
from orchestrator.transports.remote_command import agent_command, bridge_command, command_line
from orchestrator.transports.sftp_files import SftpFiles
from orchestrator.transports.ssh_connect import open_connection


class SshChannel:
    """AgentChannel over an asyncssh exec channel (bytes, no pty)."""

    def __init__(self, node: str, process: asyncssh.SSHClientProcess[bytes]) -> None:
        self._process = process
        self._stderr = StderrCollector(node)
        self._stderr_task = asyncio.create_task(self._stderr.collect(process.stderr.readline))
        self._first: bytes | None = None  # read ahead by peek_exit

    async def readline(self) -> bytes:
        if self._first is not None:
            line, self._first = self._first, None
            return line
        return await self._process.stdout.readline()

    async def peek_exit(self, timeout: float = 30.0) -> int | None:
        """The exit status if the command ends before its first line (the bridge finding
        no agent), else None; the line stays for readline()."""
        self._first = await asyncio.wait_for(self._process.stdout.readline(), timeout)
        if self._first:
            return None
        return await asyncio.wait_for(self.wait_exit(), timeout)

    async def send(self, data: bytes) -> None:
        self._process.stdin.write(data)
        await self._process.stdin.drain()

    def close_stdin(self) -> None:
        with contextlib.suppress(OSError, asyncssh.Error, BrokenPipeError):
            self._process.stdin.write_eof()

    async def wait_exit(self) -> int | None:
        completed = await self._process.wait(check=False)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(self._stderr_task), 2.0)
        return completed.exit_status

    def kill(self) -> None:
        # Closing the channel closes the agent's stdin on the node: it stops its ranks.
        self._process.close()

    def stderr_tail(self) -> list[str]:
        return list(self._stderr.lines)


class SshTransport(Transport):
    def __init__(
        self,
        node: NodeSpec,
        *,
        connect_timeout: float = 10.0,
        keepalive_interval: float = 5.0,
        keepalive_count_max: int = 3,
        code_cache: str = DEFAULT_CODE_CACHE,
        bundle: CodeBundle | None = None,
    ) -> None:
        super().__init__(node, code_cache=code_cache, bundle=bundle)
        self._connect_timeout = connect_timeout
        self._keepalive = (keepalive_interval, keepalive_count_max)
        self._conn: asyncssh.SSHClientConnection | None = None

    @property
    def connection(self) -> asyncssh.SSHClientConnection:
        if self._conn is None:
            raise RuntimeError("not connected: call connect() first")
        return self._conn

    async def connect(self) -> None:
        if self._conn is None:
            self._conn = await open_connection(
                self.node,
                connect_timeout=self._connect_timeout,
                keepalive_interval=self._keepalive[0],
                keepalive_count_max=self._keepalive[1],
            )

    async def _run(
        self, argv: list[str], stdin: str, env: dict[str, str], timeout: float
    ) -> Completed:
        await self.connect()
        try:
            result = await self.connection.run(
                command_line(argv, env), input=stdin, check=False, timeout=timeout
            )
        except TimeoutError:  # asyncssh's own is one too
            raise
        except asyncssh.Error as exc:
            raise ConnectionError(str(exc) or type(exc).__name__) from exc
        return Completed(result.exit_status, _text(result.stdout), _text(result.stderr))

    async def open_files(self) -> NodeFiles:
        await self.connect()
        return await SftpFiles.start(self.connection)

    def _deploy_failure(self, exc: OSError) -> str:
        return f"copying the code to {self._cache} by SFTP failed: {exc}"

    async def _launch(self, code_dir: str, grace_s: float, socket: str | None) -> AgentChannel:
        return await self._exec(agent_command(code_dir, check_python(self.node), grace_s, socket))

    async def _attach(self, code_dir: str, socket: str) -> AgentChannel | None:
        """Through `python -m node_agent.channel.bridge` (stdio <-> the agent's socket)."""
        channel = await self._exec(bridge_command(code_dir, check_python(self.node), socket))
        first = await channel.peek_exit()
        if first == bridge.NO_AGENT:
            return None
        if first == bridge.REFUSED:
            tail = " ".join(channel.stderr_tail()) or "the agent socket is not ours"
            raise TransportError(self.node.name, ErrorKind.AGENT_SOCKET, tail)
        return channel

    async def _exec(self, command: str) -> SshChannel:
        try:
            process = await self.connection.create_process(command, encoding=None)
        except (asyncssh.Error, OSError) as exc:
            raise TransportError(
                self.node.name, ErrorKind.AGENT_START, f"cannot open an exec channel: {exc}"
            ) from exc
        return SshChannel(self.node.name, process)

    async def close(self) -> None:
        await super().close()
        if self._conn is not None:
            self._conn.close()
            with contextlib.suppress(Exception):
                await self._conn.wait_closed()
            self._conn = None


def _text(value: object) -> str:
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    return str(value or "")
