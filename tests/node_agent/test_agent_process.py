"""`python -m node_agent` spoken to in raw JSON lines: handshake, errors, lease, stdin EOF."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from contract.agent_protocol import PROTOCOL_VERSION
from testkit import paths
from testkit.agent_events import kill_if_alive, wait_gone

ROOT = paths.ROOT
pytestmark = pytest.mark.timeout(60)


class RawAgent:
    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc

    async def send(self, obj: dict[str, Any] | bytes) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(obj if isinstance(obj, bytes) else json.dumps(obj).encode() + b"\n")
        await self.proc.stdin.drain()

    async def recv(self, timeout: float = 10.0) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = await asyncio.wait_for(self.proc.stdout.readline(), timeout)
        assert line, "the agent closed its stdout"
        return dict(json.loads(line))

    async def recv_type(self, kind: str, timeout: float = 10.0) -> dict[str, Any]:
        while True:
            msg = await self.recv(timeout)
            if msg["type"] == kind:
                return msg


@pytest.fixture
async def raw_agent() -> AsyncIterator[RawAgent]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "node_agent",
        "--grace",
        "1",
        cwd=ROOT,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
    )
    try:
        yield RawAgent(proc)
    finally:
        kill_if_alive(proc.pid)
        await proc.wait()


async def test_hello_then_handshake_required(raw_agent: RawAgent) -> None:
    """The agent greets first and refuses work before `open`."""
    hello = await raw_agent.recv()
    assert hello["type"] == "hello" and hello["protocol_version"] == PROTOCOL_VERSION
    assert hello["pid"] == raw_agent.proc.pid
    await raw_agent.send({"type": "ping", "id": 5})
    error = await raw_agent.recv()
    assert (error["type"], error["id"], error["code"]) == ("error", 5, "handshake_required")


async def test_protocol_mismatch_is_refused_and_ends_the_agent(raw_agent: RawAgent) -> None:
    """Another protocol version gets a clear error and the agent exits with code 3."""
    await raw_agent.recv_type("hello")
    await raw_agent.send({"type": "open", "id": 1, "protocol_version": PROTOCOL_VERSION + 1})
    error = await raw_agent.recv()
    assert (error["type"], error["id"], error["code"]) == ("error", 1, "protocol_mismatch")
    assert f"speaks protocol {PROTOCOL_VERSION}" in error["message"]
    assert await asyncio.wait_for(raw_agent.proc.wait(), 10) == 3


async def test_undecodable_requests_get_errors_with_their_id(raw_agent: RawAgent) -> None:
    """Garbage and unknown request types are answered, addressed by id when it can be read."""
    await raw_agent.recv_type("hello")
    await raw_agent.send({"type": "open", "id": 1, "protocol_version": PROTOCOL_VERSION})
    assert (await raw_agent.recv())["type"] == "ok"
    await raw_agent.send({"type": "format_disk", "id": 9})
    unknown = await raw_agent.recv()
    assert (unknown["type"], unknown["id"], unknown["code"]) == ("error", 9, "bad_request")
    await raw_agent.send(b"not json\n")
    garbage = await raw_agent.recv()
    assert garbage["type"] == "error" and garbage.get("id") is None
    await raw_agent.send({"type": "spawn", "id": 10, "rank": "zero", "argv": ["true"]})
    assert (await raw_agent.recv())["id"] == 10
    await raw_agent.send({"type": "ping", "id": 11})
    assert (await raw_agent.recv())["type"] == "pong"


async def test_stdin_eof_stops_ranks_and_exits(raw_agent: RawAgent) -> None:
    """Closing the agent's stdin stops its ranks (SIGTERM) and ends it with status 0."""
    await raw_agent.recv_type("hello")
    await raw_agent.send({"type": "open", "id": 1, "protocol_version": PROTOCOL_VERSION})
    await raw_agent.send({"type": "spawn", "id": 2, "rank": 0, "argv": ["sleep", "1000"]})
    pid = (await raw_agent.recv_type("spawned"))["pid"]
    try:
        assert raw_agent.proc.stdin is not None
        raw_agent.proc.stdin.close()
        exited = await raw_agent.recv_type("exited")
        assert (exited["pid"], exited["signal"], exited["stopped"]) == (pid, "SIGTERM", True)
        assert await asyncio.wait_for(raw_agent.proc.wait(), 10) == 0
        assert await wait_gone(pid)
    finally:
        kill_if_alive(pid)


STUBBORN_RANK = (
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
    "print('ready', flush=True); time.sleep(1000)"
)


async def test_a_stop_in_its_grace_period_does_not_hold_up_a_ping(raw_agent: RawAgent) -> None:
    """A Stop waiting out its grace period is answered out of order: a later Ping first."""
    await raw_agent.recv_type("hello")
    await raw_agent.send({"type": "open", "id": 1, "protocol_version": PROTOCOL_VERSION})
    argv = [sys.executable, "-c", STUBBORN_RANK]
    await raw_agent.send({"type": "spawn", "id": 2, "rank": 0, "argv": argv})
    pid = (await raw_agent.recv_type("spawned"))["pid"]
    try:
        while (await raw_agent.recv_type("log"))["line"].strip() != "ready":
            pass  # SIGTERM is ignored from now on: the Stop waits its whole grace period
        await raw_agent.send({"type": "stop", "id": 3, "rank": 0, "grace_s": 2.0})
        await raw_agent.send({"type": "ping", "id": 4})
        replies = []
        while len(replies) < 2:
            msg = await raw_agent.recv()
            if msg.get("id") in (3, 4):
                replies.append((msg["type"], msg["id"]))
        assert replies == [("pong", 4), ("stopped", 3)]
    finally:
        kill_if_alive(pid)


async def test_lease_expiry_stops_ranks(raw_agent: RawAgent) -> None:
    """Without requests for lease_s the agent stops its ranks and exits."""
    await raw_agent.recv_type("hello")
    await raw_agent.send(
        {"type": "open", "id": 1, "protocol_version": PROTOCOL_VERSION, "lease_s": 1.0}
    )
    await raw_agent.send({"type": "spawn", "id": 2, "rank": 0, "argv": ["sleep", "1000"]})
    pid = (await raw_agent.recv_type("spawned"))["pid"]
    try:
        exited = await raw_agent.recv_type("exited")
        assert exited["stopped"] and exited["pid"] == pid
        assert await asyncio.wait_for(raw_agent.proc.wait(), 10) == 0
    finally:
        kill_if_alive(pid)


async def test_fingerprint_of_a_directory_without_model(
    raw_agent: RawAgent, tmp_path: Path
) -> None:
    """Fingerprint answers out of band with the model part filled in, problems as text."""
    await raw_agent.recv_type("hello")
    await raw_agent.send({"type": "open", "id": 1, "protocol_version": PROTOCOL_VERSION})
    await raw_agent.send({"type": "fingerprint", "id": 2, "model": str(tmp_path)})
    reply = await raw_agent.recv_type("fingerprint_result")
    assert reply["fingerprint"]["model"]["exists"] is True
    assert "config.json" in reply["fingerprint"]["model"]["error"]
