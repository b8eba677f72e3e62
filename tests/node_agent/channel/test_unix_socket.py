"""The agent socket's bad input: another user's socket, a dead agent's, a second
orchestrator, an orchestrator of another protocol; and the orphan grace running out."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from contract.agent_protocol import PROTOCOL_VERSION
from node_agent.channel import bridge, unix_socket
from orchestrator.config import NodeSpec
from orchestrator.transports import TransportError
from orchestrator.transports.base import AgentOptions
from orchestrator.transports.local import LocalTransport
from testkit import paths, require
from testkit.agent_events import kill_if_alive, pid_gone, wait_gone
from testkit.ports import free_port
from testkit.require import missing

ROOT = paths.ROOT
pytestmark = pytest.mark.timeout(60)


def _dead_agent_socket(path: Path) -> None:
    """A socket file nobody listens on: what a SIGKILLed agent leaves."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(path))
    sock.close()


def test_socket_of_another_user_is_refused_and_left_alone(tmp_path: Path) -> None:
    """Another user's socket (given to it: root only): refused by the checks and the
    bridge, never removed."""
    if os.getuid() != 0:
        missing("giving a socket to another user needs root", require.ROOT)
    path = tmp_path / "agents" / "c.n.sock"
    _dead_agent_socket(path)
    os.chown(path, os.getuid() + 1, os.getuid() + 1)
    with pytest.raises(unix_socket.SocketRefused, match="belongs to uid"):
        unix_socket.check_owned(path)
    assert bridge.relay(str(path)) == bridge.REFUSED
    assert path.exists()


def test_the_owner_check_compares_with_the_uid_asked_for(tmp_path: Path) -> None:
    """Any user: our own socket, checked as another uid's, is refused and left alone."""
    path = tmp_path / "agents" / "c.n.sock"
    _dead_agent_socket(path)
    with pytest.raises(unix_socket.SocketRefused, match="belongs to uid"):
        unix_socket.check_owned(path, os.getuid() + 1)
    assert path.exists()


def test_directory_open_to_others_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "agents" / "c.n.sock"
    path.parent.mkdir(mode=0o777)
    path.parent.chmod(0o777)
    with pytest.raises(unix_socket.SocketRefused, match="chmod 700"):
        unix_socket.check_owned(path)


async def test_stale_socket_is_removed_and_a_fresh_agent_takes_it(tmp_path: Path) -> None:
    """A dead agent's socket: connect finds no agent and removes it; a new agent listens."""
    path = tmp_path / "agents" / "c.n.sock"
    _dead_agent_socket(path)
    assert bridge.relay(str(path)) == bridge.NO_AGENT
    assert not path.exists()
    _dead_agent_socket(path)
    assert await unix_socket.connect(str(path)) is None and not path.exists()
    _dead_agent_socket(path)

    async def ignore(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.close()

    server, _ = await unix_socket.serve(str(path), ignore)
    try:
        assert oct(path.stat().st_mode & 0o777) == oct(0o600)
        with pytest.raises(unix_socket.SocketRefused, match="already listens"):
            await unix_socket.serve(str(path), ignore)
    finally:
        server.close()


class Agent:
    """A real `python -m node_agent --socket` on pipes, spoken to in raw JSON lines."""

    def __init__(self, proc: asyncio.subprocess.Process, path: Path) -> None:
        self.proc, self.path = proc, path

    async def send(self, obj: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(obj).encode() + b"\n")
        await self.proc.stdin.drain()

    async def recv_type(self, kind: str) -> dict[str, Any]:
        assert self.proc.stdout is not None
        while True:
            line = await asyncio.wait_for(self.proc.stdout.readline(), 10)
            assert line, "the agent closed its stdout"
            if (msg := json.loads(line))["type"] == kind:
                return dict(msg)

    async def open_with_rank(self, grace_s: float, **fields: Any) -> int:
        """Open with an orphan grace and start a stand-in rank; its pid."""
        await self.recv_type("hello")
        await self.send({"type": "open", "id": 1, "protocol_version": PROTOCOL_VERSION,
                         "orphan_grace_s": grace_s, **fields})
        await self.send({"type": "spawn", "id": 2, "rank": 0, "argv": ["sleep", "1000"]})
        return int((await self.recv_type("spawned"))["pid"])


@pytest.fixture
async def agent(tmp_path: Path) -> AsyncIterator[Agent]:
    path = tmp_path / "agents" / "test.n.sock"
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "node_agent", "--grace", "1", "--socket", str(path), cwd=ROOT,
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL, start_new_session=True,
    )
    try:
        yield Agent(proc, path)
    finally:
        kill_if_alive(proc.pid)
        await proc.wait()


async def test_orphan_grace_ends_the_ranks_of_an_orchestrator_that_never_returns(
    agent: Agent,
) -> None:
    """EOF with a gang: the rank serves on through the grace, then it and the agent end."""
    rank = await agent.open_with_rank(grace_s=2.0)
    assert agent.proc.stdin is not None
    agent.proc.stdin.close()
    await asyncio.sleep(1.0)
    assert not pid_gone(rank), "the rank died with the session"
    assert await asyncio.wait_for(agent.proc.wait(), 15) == 0
    assert await wait_gone(rank, 5)
    assert not agent.path.exists()
    log = agent.path.with_suffix(".log").read_text()
    assert "no orchestrator adopted the gang within 2 s (orphan_grace_s)" in log


async def _open_on_socket(
    path: Path, orchestrator_id: str, **fields: Any
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, dict[str, Any]]:
    """Connect to the agent socket, read its hello, send Open: the reply."""
    reader, writer = await asyncio.open_unix_connection(str(path))
    hello = json.loads(await asyncio.wait_for(reader.readline(), 10))
    assert hello["type"] == "hello", hello
    opening = {"type": "open", "id": 1, "protocol_version": PROTOCOL_VERSION,
               "orchestrator_id": orchestrator_id, **fields}
    writer.write(json.dumps(opening).encode() + b"\n")
    await writer.drain()
    return reader, writer, json.loads(await asyncio.wait_for(reader.readline(), 10))


async def test_second_orchestrator_is_refused_while_one_is_connected(agent: Agent) -> None:
    """One controlling connection at a time: another orchestrator's Open gets agent_busy
    and the connection closes; nothing is ended."""
    rank = await agent.open_with_rank(grace_s=30.0, orchestrator_id="first", lease_s=30.0)
    reader, writer, reply = await _open_on_socket(agent.path, "second")
    assert (reply["type"], reply["code"]) == ("error", "agent_busy"), reply
    assert await reader.readline() == b""  # and closed
    writer.close()
    await agent.send({"type": "ping", "id": 3})  # the first session is still in control
    assert (await agent.recv_type("pong"))["ranks"] == 1
    assert not pid_gone(rank) and agent.proc.returncode is None


async def test_the_same_orchestrator_reconnecting_takes_over_its_old_session(
    agent: Agent,
) -> None:
    """A node that slept: its agent never saw the old session end (TCP still retransmits
    into it). The same orchestrator's new connection takes over; the ranks serve on, and
    what the old session opened (a link listener on a rank's port) is closed."""
    rank = await agent.open_with_rank(grace_s=30.0, orchestrator_id="ours", lease_s=30.0)
    port = free_port()
    await agent.send({"type": "listen", "id": 3, "host": "127.0.0.1", "port": port})
    await agent.recv_type("ok")
    reader, writer, reply = await _open_on_socket(agent.path, "ours", lease_s=30.0)
    assert reply == {"type": "ok", "id": 1}, reply
    assert agent.proc.stdout is not None
    assert await asyncio.wait_for(agent.proc.stdout.read(), 10) == b""  # the old one closed
    writer.write(json.dumps({"type": "list", "id": 2}).encode() + b"\n")
    await writer.drain()
    ranks = json.loads(await asyncio.wait_for(reader.readline(), 10))
    assert [r["pid"] for r in ranks["ranks"]] == [rank] and ranks.get("orphaned_since") is None
    writer.close()
    assert not pid_gone(rank)
    with socket.create_server(("127.0.0.1", port)):  # free again for the next gang's rank
        pass


async def test_a_session_whose_lease_lapsed_gives_way_to_another_orchestrator(
    agent: Agent,
) -> None:
    """No request within its lease: the session no longer holds the agent, even before
    its own lease timer fires (a frozen host's timers are late)."""
    rank = await agent.open_with_rank(grace_s=30.0, orchestrator_id="gone", lease_s=0.5)
    await asyncio.sleep(0.8)
    _, writer, reply = await _open_on_socket(agent.path, "new", lease_s=30.0)
    assert reply == {"type": "ok", "id": 1}, reply
    writer.close()
    assert not pid_gone(rank)


async def orphaned_with_rank(agent: Agent) -> int:
    """A rank opened, then the agent's orchestrator gone (stdin closed): the rank's pid."""
    rank = await agent.open_with_rank(grace_s=30.0)
    assert agent.proc.stdin is not None
    agent.proc.stdin.close()
    for _ in range(100):  # orphaned: it logs to its file from then on
        if agent.path.with_suffix(".log").exists():
            break
        await asyncio.sleep(0.05)
    return rank


async def test_agent_of_another_protocol_ends_its_gang_for_a_relaunch(
    agent: Agent, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """An orchestrator of another protocol finds an orphaned agent: it says why, the agent
    ends its ranks and exits, and the socket is free for a fresh agent (attach: None)."""
    rank = await orphaned_with_rank(agent)
    monkeypatch.setattr("orchestrator.transports.handle.PROTOCOL_VERSION", PROTOCOL_VERSION + 1)
    transport = LocalTransport(NodeSpec(name="n"))
    options = AgentOptions(None, None, 30.0, 20.0, "new")
    with caplog.at_level(logging.WARNING):
        assert await transport.attach_agent(str(agent.path), options) is None
    assert f"the agent speaks protocol {PROTOCOL_VERSION}, this orchestrator" in caplog.text
    assert "to be relaunched" in caplog.text
    assert await asyncio.wait_for(agent.proc.wait(), 10) == 3
    assert await wait_gone(rank, 5)


async def test_a_look_of_another_protocol_leaves_the_gang_serving(
    agent: Agent, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`status` of another version (end_other_versions=False) finds an orphaned agent: it
    is told apart (TransportError naming both versions, "left running"), and the agent and
    its rank go on; a later attach of the same version still reaches it."""
    rank = await orphaned_with_rank(agent)
    monkeypatch.setattr("orchestrator.transports.handle.PROTOCOL_VERSION", PROTOCOL_VERSION + 1)
    transport = LocalTransport(NodeSpec(name="n"))
    look = AgentOptions(None, None, 30.0, 20.0, "status", end_other_versions=False)
    with pytest.raises(TransportError, match="left running"):
        await transport.attach_agent(str(agent.path), look)
    await asyncio.sleep(0.5)
    assert agent.proc.returncode is None and not pid_gone(rank)
    monkeypatch.undo()
    same = AgentOptions(None, None, 30.0, 20.0, "same")
    handle = await transport.attach_agent(str(agent.path), same)
    assert handle is not None
    await handle.close()
