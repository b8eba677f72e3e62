"""The `local` transport: the node agent as a subprocess of the orchestrator, over pipes.

The code is deployed the same way as over SSH (a content-addressed copy in the
local cache), so a local node runs exactly what a remote one would. Commands without
an agent are subprocesses too; files are this machine's (local_files.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal

from contract.process_env import passed_env
from node_agent.channel import unix_socket
from orchestrator.transports.base import Completed, Transport, check_python
from orchestrator.transports.errors import ErrorKind, TransportError
from orchestrator.transports.files import NodeFiles
from orchestrator.transports.handle import AgentChannel, StderrCollector
from orchestrator.transports.local_files import LocalFiles

PIPE_LIMIT = 64 << 20  # one protocol line (a fingerprint, a long log line) must fit


class ProcessChannel:
    """AgentChannel over an asyncio subprocess's pipes."""

    def __init__(self, node: str, proc: asyncio.subprocess.Process) -> None:
        assert proc.stdin and proc.stdout and proc.stderr
        self._proc = proc
        self._stdin = proc.stdin
        self._stdout = proc.stdout
        self._stderr = StderrCollector(node)
        self._stderr_task = asyncio.create_task(self._stderr.collect(proc.stderr.readline))
        self._reaper: asyncio.Task[int | None] | None = None

    async def readline(self) -> bytes:
        return await self._stdout.readline()

    async def send(self, data: bytes) -> None:
        self._stdin.write(data)
        await self._stdin.drain()

    def close_stdin(self) -> None:
        if not self._stdin.is_closing():
            self._stdin.close()

    async def wait_exit(self) -> int | None:
        status = await self._proc.wait()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(self._stderr_task), 2.0)
        self._close_transport()
        return status

    def kill(self) -> None:
        # The agent leads its own session; its ranks have their own sessions and
        # die by PR_SET_PDEATHSIG (Linux) or their parent watch (macOS).
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self._proc.pid, signal.SIGKILL)
        if self._reaper is None:  # reap it, then release the pipes
            self._reaper = asyncio.create_task(self.wait_exit())

    def _close_transport(self) -> None:
        # asyncio.subprocess.Process has no public close(); an unclosed transport
        # of a finished process only warns (ResourceWarning) when collected.
        transport = getattr(self._proc, "_transport", None)
        if transport is not None:
            transport.close()

    def stderr_tail(self) -> list[str]:
        return list(self._stderr.lines)


class SocketChannel:
    """AgentChannel over the agent's Unix socket (an agent a previous run left here)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader, self._writer = reader, writer

    async def readline(self) -> bytes:
        return await self._reader.readline()

    async def send(self, data: bytes) -> None:
        self._writer.write(data)
        await self._writer.drain()

    def close_stdin(self) -> None:
        with contextlib.suppress(OSError, RuntimeError):
            self._writer.write_eof()

    async def wait_exit(self) -> int | None:
        self._writer.close()
        with contextlib.suppress(OSError, RuntimeError):
            await self._writer.wait_closed()
        return None  # the agent lives on (or not): it is no child of ours

    def kill(self) -> None:
        self._writer.close()

    def stderr_tail(self) -> list[str]:
        return []  # its log is <socket>.log on the node


class LocalTransport(Transport):
    async def _run(
        self, argv: list[str], stdin: str, env: dict[str, str], timeout: float
    ) -> Completed:
        program = os.path.expanduser(argv[0])
        try:
            process = await asyncio.create_subprocess_exec(
                program,
                *argv[1:],
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env={**os.environ, **env},
            )
        except (FileNotFoundError, PermissionError) as exc:
            return Completed(127, "", str(exc))
        try:
            out, err = await asyncio.wait_for(process.communicate(stdin.encode()), timeout)
        except BaseException:
            process.kill()  # our own child, by its PID
            await process.wait()
            raise
        return Completed(process.returncode, out.decode(errors="replace"), err.decode())

    async def open_files(self) -> NodeFiles:
        return LocalFiles()

    def _deploy_failure(self, exc: OSError) -> str:
        return f"cannot copy the code to {os.path.expanduser(self._cache)}: {exc}"

    async def _attach(self, code_dir: str, socket: str) -> AgentChannel | None:
        try:
            streams = await unix_socket.connect(socket, PIPE_LIMIT)
        except unix_socket.SocketRefused as exc:
            raise TransportError(self.node.name, ErrorKind.AGENT_SOCKET, str(exc)) from None
        return SocketChannel(*streams) if streams else None

    async def _launch(self, code_dir: str, grace_s: float, socket: str | None) -> AgentChannel:
        python = os.path.expanduser(check_python(self.node))
        options = ["--socket", socket] if socket else []
        try:
            proc = await asyncio.create_subprocess_exec(
                python,
                "-m",
                "node_agent",
                "--grace",
                f"{grace_s:g}",
                *options,
                cwd=code_dir,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                # Its own session: Ctrl-C in the operator's shell reaches the
                # orchestrator only, which then stops the gang in order.
                start_new_session=True,
                limit=PIPE_LIMIT,
                # What it and its ranks need of ours, no secret (contract/process_env.py).
                env=passed_env(os.environ),
            )
        except OSError as exc:
            raise TransportError(
                self.node.name, ErrorKind.AGENT_START, f"cannot run python {python!r}: {exc}"
            ) from exc
        return ProcessChannel(self.node.name, proc)
