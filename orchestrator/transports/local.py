"""The `local` transport: the node agent as a subprocess of the orchestrator, over pipes.

The code is deployed the same way as over SSH (a content-addressed copy in the
local cache), so a local node runs exactly what a remote one would.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Callable
from pathlib import Path

from contract.agent_protocol import Event
from orchestrator.config import NodeSpec
from orchestrator.transports.base import DEFAULT_CODE_CACHE, DeployResult, Transport, check_python
from orchestrator.transports.deploy import CodeBundle, deploy_local
from orchestrator.transports.errors import ErrorKind, TransportError
from orchestrator.transports.handle import AgentHandle, StderrCollector

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


class LocalTransport(Transport):
    def __init__(
        self,
        node: NodeSpec,
        *,
        code_cache: str | Path = DEFAULT_CODE_CACHE,
        bundle: CodeBundle | None = None,
    ) -> None:
        super().__init__(node)
        self._cache = Path(code_cache).expanduser()
        self._bundle = bundle

    async def deploy(self) -> DeployResult:
        bundle = self._bundle or CodeBundle.from_local()
        try:
            code_dir, copied = await asyncio.to_thread(deploy_local, bundle, self._cache)
        except OSError as exc:
            raise TransportError(
                self.node.name, ErrorKind.DEPLOY, f"cannot copy the code to {self._cache}: {exc}"
            ) from exc
        self._deployed = DeployResult(str(code_dir), bundle.digest, copied)
        return self._deployed

    async def _launch(
        self,
        code_dir: str,
        on_event: Callable[[Event], None] | None,
        lease_s: float | None,
        grace_s: float,
    ) -> AgentHandle:
        python = os.path.expanduser(check_python(self.node))
        try:
            proc = await asyncio.create_subprocess_exec(
                python,
                "-m",
                "node_agent",
                "--grace",
                f"{grace_s:g}",
                cwd=code_dir,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                # Its own session: Ctrl-C in the operator's shell reaches the
                # orchestrator only, which then stops the gang in order.
                start_new_session=True,
                limit=PIPE_LIMIT,
            )
        except OSError as exc:
            raise TransportError(
                self.node.name, ErrorKind.AGENT_START, f"cannot run python {python!r}: {exc}"
            ) from exc
        return AgentHandle(
            self.node.name, ProcessChannel(self.node.name, proc), on_event=on_event, lease_s=lease_s
        )
