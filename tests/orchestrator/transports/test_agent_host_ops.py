"""Agent requests the orchestrator's launch and clean-up rely on: rank files, ports, reaping."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from contract.agent_protocol import Spawn, Spawned
from orchestrator.config import NodeSpec
from orchestrator.transports import AgentHandle, AgentRequestError, LocalTransport
from testkit.agent_events import kill_if_alive, pid_gone, wait_gone


@pytest.fixture
async def agent(tmp_path: Path) -> AsyncIterator[AgentHandle]:
    transport = LocalTransport(NodeSpec(name="local0"), code_cache=tmp_path / "code")
    handle = await transport.start_agent()
    try:
        yield handle
    finally:
        await transport.close()


async def test_spawn_writes_rank_files_into_new_cwd(agent: AgentHandle, tmp_path: Path) -> None:
    """Spawn creates cwd, writes the files there (0600), and the rank reads them."""
    cwd = tmp_path / "runs" / "launch-1" / "rank0"
    argv = [
        sys.executable,
        "-c",
        "import sys; sys.exit(0 if open('hostfile.json').read() == '[1]' else 9)",
    ]
    request = Spawn(rank=0, argv=argv, cwd=str(cwd), files={"hostfile.json": "[1]"})
    reply = await agent.request(request, Spawned, 30)
    assert await wait_gone(reply.pid)
    assert (cwd / "hostfile.json").read_text() == "[1]"
    assert (cwd / "hostfile.json").stat().st_mode & 0o777 == 0o600


@pytest.mark.parametrize("name", ["../escape", "/etc/passwd", "a/b", ""])
async def test_spawn_refuses_file_names_leaving_cwd(
    agent: AgentHandle, tmp_path: Path, name: str
) -> None:
    """A file name with a path in it is refused and nothing is started."""
    request = Spawn(
        rank=0, argv=[sys.executable, "-c", "pass"], cwd=str(tmp_path / "r"), files={name: "x"}
    )
    with pytest.raises(AgentRequestError, match="plain name"):
        await agent.request(request, Spawned, 30)
    assert not (tmp_path / "escape").exists()


async def test_ports_in_use(agent: AgentHandle) -> None:
    """A port with a listener is reported; a free one is not."""
    with socket.socket() as listener, socket.socket() as spare:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        spare.bind(("127.0.0.1", 0))
        busy, free = listener.getsockname()[1], spare.getsockname()[1]
        spare.close()
        assert await agent.ports_in_use("127.0.0.1", [busy, free]) == [busy]


async def test_reap_kills_only_its_launch(agent: AgentHandle) -> None:
    """Reap ends a process carrying the launch id, and refuses one that does not."""
    sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
    ours = subprocess.Popen(
        sleeper, env={**os.environ, "MLX_LAUNCH_ID": "L1"}, start_new_session=True
    )
    stranger = subprocess.Popen(
        sleeper, env={**os.environ, "MLX_LAUNCH_ID": "OTHER"}, start_new_session=True
    )
    try:
        assert not await agent.reap(stranger.pid, "L1", grace_s=1)
        assert await agent.reap(ours.pid, "L1", grace_s=1)
        ours.wait(10)
        assert stranger.poll() is None and not pid_gone(stranger.pid)
        assert not await agent.reap(ours.pid, "L1", grace_s=1)  # already gone
    finally:
        for process in (ours, stranger):
            kill_if_alive(process.pid)
            process.wait(10)
