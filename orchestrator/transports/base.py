"""The Transport interface: reach a node, put our code there, run its agent.

    async with transport_for(node) as t:        # connect (SSH: TCP + auth + host key)
        deployed = await t.deploy()             # code at <cache>/code/<digest>/, copied once
        async with await t.start_agent() as agent:   # AgentHandle
            fp = await agent.fingerprint(model)

A node without an agent (bootstrap: it may have no msgspec yet) is reached through the
same transport: `run(argv)` runs one command, `open_files()` gives its files (files.py).

Subclasses: LocalTransport (a subprocess on this machine) and SshTransport
(asyncssh). Like dask's SSHCluster, the SSH detail lives in its subclass only.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from contract.agent_protocol import Event
from orchestrator.config import NodeSpec
from orchestrator.transports.deploy import CodeBundle, deploy_code
from orchestrator.transports.errors import ErrorKind, TransportError
from orchestrator.transports.files import NodeFiles
from orchestrator.transports.handle import DEFAULT_LEASE_S, AgentChannel, AgentHandle

log = logging.getLogger("orchestrator.transports")

DEFAULT_CODE_CACHE = "~/.cache/mlx-cluster-orchestrator/code"
DEFAULT_AGENT_GRACE_S = 5.0


@dataclass(frozen=True)
class DeployResult:
    code_dir: str  # on the node
    digest: str
    copied_files: int  # 0 when that digest was already there


@dataclass(frozen=True)
class AgentOptions:
    on_event: Callable[[Event], None] | None
    lease_s: float | None
    orphan_grace_s: float
    start_timeout: float
    orchestrator_id: str
    # An agent of another protocol version is told to end its gang (up, down relaunch or
    # end it); `status` only looks and passes False: it reports such an agent, ends nothing.
    end_other_versions: bool = True


@dataclass(frozen=True)
class Completed:
    returncode: int | None  # None: the command did not exit (killed, channel closed)
    stdout: str
    stderr: str


class Transport(ABC):
    def __init__(
        self,
        node: NodeSpec,
        *,
        code_cache: str | Path = DEFAULT_CODE_CACHE,
        bundle: CodeBundle | None = None,
    ) -> None:
        self.node = node
        self._cache = str(code_cache)
        self._bundle = bundle
        self._handles: list[AgentHandle] = []
        self._deployed: DeployResult | None = None

    async def connect(self) -> None:  # noqa: B027 - optional hook, a no-op for local
        """Open what the transport needs (nothing for local)."""

    async def run(
        self,
        argv: Sequence[str],
        *,
        stdin: str = "",
        env: dict[str, str] | None = None,
        timeout: float = 600.0,
    ) -> Completed:
        """Run argv on the node, no agent needed; a program missing there gives returncode
        127. A lost node raises ConnectionError, a command over its time TimeoutError."""
        return await self._run(list(argv), stdin, env or {}, timeout)

    @abstractmethod
    async def _run(
        self, argv: list[str], stdin: str, env: dict[str, str], timeout: float
    ) -> Completed: ...

    @abstractmethod
    async def open_files(self) -> NodeFiles:
        """The node's files (close them, or use `async with`); failures are OSErrors."""

    async def deploy(self) -> DeployResult:
        """Make node_agent + serving available on the node; idempotent, content-addressed."""
        await self.connect()
        bundle = self._bundle or CodeBundle.from_local()
        try:
            async with await self.open_files() as files:
                code_dir, copied = await deploy_code(files, bundle, self._cache)
        except OSError as exc:
            raise TransportError(
                self.node.name, ErrorKind.DEPLOY, self._deploy_failure(exc)
            ) from exc
        self._deployed = DeployResult(code_dir, bundle.digest, copied)
        return self._deployed

    @abstractmethod
    def _deploy_failure(self, exc: OSError) -> str:
        """What the user reads when the code cannot be copied."""

    async def start_agent(
        self,
        *,
        on_event: Callable[[Event], None] | None = None,
        lease_s: float | None = DEFAULT_LEASE_S,
        grace_s: float = DEFAULT_AGENT_GRACE_S,
        start_timeout: float = 30.0,
        socket: str | None = None,
        orphan_grace_s: float = 0.0,
        orchestrator_id: str | None = None,
    ) -> AgentHandle:
        """Deploy if needed, reach the agent a previous run left on `socket` or start
        `python -m node_agent` on the node, handshake.

        grace_s: how long the agent waits between SIGTERM and SIGKILL for its
        ranks when it shuts down on its own (channel lost, lease expired)."""
        deployed = self._deployed or await self.deploy()
        orchestrator_id = orchestrator_id or secrets.token_hex(8)  # None: a caller of its own
        options = AgentOptions(on_event, lease_s, orphan_grace_s, start_timeout, orchestrator_id)
        if socket:
            attached = await self.attach_agent(socket, options)
            if attached is not None:
                return attached
        channel = await self._launch(deployed.code_dir, grace_s, socket)
        return await self._started(self._handle(channel, options, attached=False), options)

    async def attach_agent(self, socket: str, options: AgentOptions) -> AgentHandle | None:
        """The agent listening on `socket`, handshaken; None when there is none (a stale
        socket is removed). One of another protocol is told to end its gang: None once it
        has gone. TransportError: another orchestrator has it, or the socket is not ours."""
        deadline, ending = time.monotonic() + options.start_timeout, False
        while time.monotonic() < deadline:
            deployed = self._deployed or await self.deploy()
            channel = await self._attach(deployed.code_dir, socket)
            if channel is None:
                return None
            try:
                return await self._started(self._handle(channel, options, True), options)
            except TransportError as exc:
                if exc.kind == ErrorKind.PROTOCOL and not options.end_other_versions:
                    raise
                if exc.kind == ErrorKind.PROTOCOL:
                    log.warning("[%s] relaunching: %s", self.node.name, exc.message)
                    ending = True
                elif not (ending and exc.kind == ErrorKind.AGENT_BUSY):  # busy: still ending
                    raise
            await asyncio.sleep(0.5)  # until the old agent has gone with its socket
        raise TransportError(self.node.name, ErrorKind.AGENT_START,
                             f"the agent on {socket} did not go within {options.start_timeout:g} s")

    def _handle(self, channel: AgentChannel, options: AgentOptions, attached: bool) -> AgentHandle:
        return AgentHandle(self.node.name, channel, on_event=options.on_event,
                           lease_s=options.lease_s, orphan_grace_s=options.orphan_grace_s,
                           orchestrator_id=options.orchestrator_id,
                           attached=attached, end_other_versions=options.end_other_versions)

    async def _started(self, handle: AgentHandle, options: AgentOptions) -> AgentHandle:
        self._handles.append(handle)
        try:
            await handle.start(options.start_timeout)
        except BaseException:
            self._handles.remove(handle)
            await handle.close(timeout=5.0)
            raise
        return handle

    @abstractmethod
    async def _attach(self, code_dir: str, socket: str) -> AgentChannel | None:
        """A channel to the agent on `socket`, None when no agent listens there."""

    @abstractmethod
    async def _launch(self, code_dir: str, grace_s: float, socket: str | None) -> AgentChannel:
        """Start the agent process (listening on `socket` when given)."""

    async def close(self) -> None:
        """Close every agent this transport started (their ranks stop), then the connection."""
        for handle in self._handles:
            try:
                await handle.close()
            except Exception:
                log.exception("[%s] closing the agent failed", self.node.name)
        self._handles.clear()

    async def __aenter__(self) -> Transport:
        await self.connect()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()


def check_python(node: NodeSpec) -> str:
    """The node's python value, refused when it could be read as an option by exec."""
    python = node.python_executable
    if not python or python.startswith("-"):
        raise TransportError(
            node.name, ErrorKind.CONFIG, f"python = {python!r} is not a command or path"
        )
    return python
