"""The local transport end to end: deploy, agent, fingerprint, ranks, stop, loss of the agent."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from contract.agent_protocol import Exited, Spawn, Stop, Stopped
from node_agent.code_digest import DIGEST_FILE
from orchestrator.config import NodeSpec
from orchestrator.transports import (
    AgentHandle,
    AgentRequestError,
    ErrorKind,
    LocalTransport,
    TransportError,
)
from testkit.agent_events import (
    CHATTY_RANK,
    EventLog,
    kill_if_alive,
    pid_gone,
    wait_gone,
)


def local_node(**overrides: object) -> NodeSpec:
    return NodeSpec(**{"name": "local0", "python": sys.executable, **overrides})  # type: ignore[arg-type]


@pytest.fixture
async def agent(tmp_path: Path) -> AsyncIterator[tuple[AgentHandle, EventLog, LocalTransport]]:
    events = EventLog()
    transport = LocalTransport(local_node(), code_cache=tmp_path / "code")
    handle = await transport.start_agent(on_event=events)
    try:
        yield handle, events, transport
    finally:
        await transport.close()
        assert handle.hello is not None
        kill_if_alive(handle.hello.pid)


async def test_deploy_twice_copies_once(tmp_path: Path) -> None:
    """The second deploy of the same code copies nothing and reuses the directory."""
    transport = LocalTransport(local_node(), code_cache=tmp_path / "code")
    first = await transport.deploy()
    second = await transport.deploy()
    assert first.copied_files > 0 and second.copied_files == 0
    assert first.code_dir == second.code_dir == str(tmp_path / "code" / first.digest)
    code = Path(first.code_dir)
    assert (code / DIGEST_FILE).read_text().strip() == first.digest
    assert (code / "contract" / "agent_protocol.py").is_file()
    assert (code / "node_agent" / "agent.py").is_file()
    assert (code / "serving" / "__init__.py").is_file()
    assert not [p for p in (tmp_path / "code").iterdir() if p.name.startswith(".tmp")]


async def test_fingerprint(agent: tuple[AgentHandle, EventLog, LocalTransport]) -> None:
    """The agent reports this machine: hostname, loopback address, mlx, the deployed code."""
    handle, _, transport = agent
    fp = await handle.fingerprint()
    assert fp.hostname == socket.gethostname()
    assert "127.0.0.1" in fp.addresses()
    assert fp.os.system == "Linux" and fp.cpu_count
    assert fp.memory is not None and fp.memory.total_bytes > 0
    assert fp.packages["mlx"] and fp.packages["msgspec"]
    assert fp.python.executable == sys.executable
    assert (
        fp.rdma is not None
        and fp.rdma.status == "unavailable"
        and "rdma_ctl" in (fp.rdma.reason or "")
    )
    assert transport._deployed is not None
    assert fp.code_digest == transport._deployed.digest
    assert fp.model is None and fp.disk is not None and fp.disk.free_bytes > 0


async def test_spawn_logs_stop_and_exit(
    tmp_path: Path, agent: tuple[AgentHandle, EventLog, LocalTransport]
) -> None:
    """A rank's lines arrive as events and in its log file; stop ends it with SIGTERM."""
    handle, events, _ = agent
    log_file = tmp_path / "logs" / "rank0.log"
    spawned = await handle.spawn(
        Spawn(rank=0, argv=CHATTY_RANK, log_file=str(log_file), env={"MLX_LAUNCH_ID": "L1"})
    )
    try:
        await events.wait_for(lambda: "warn on stderr" in events.lines(0, "stderr"))
        await events.wait_for(lambda: "launch L1" in events.lines(0, "stdout"))
        assert f"ready {spawned.pid}" in events.lines(0, "stdout")
        (info,) = await handle.list_ranks()
        assert (info.rank, info.pid, info.launch_id) == (0, spawned.pid, "L1")
        (exited,) = await handle.stop(0, grace_s=5.0)
        assert (exited.rank, exited.pid, exited.signal, exited.stopped) == (
            0,
            spawned.pid,
            "SIGTERM",
            True,
        )
        assert exited.launch_id == "L1" and exited.stderr_tail == ["warn on stderr"]
        assert pid_gone(spawned.pid)
        assert (await events.wait_exit(0)).signal == "SIGTERM"
        text = log_file.read_text()
        assert "ready" in text and "warn on stderr" in text
        assert await handle.list_ranks() == []
    finally:
        kill_if_alive(spawned.pid)


async def test_exit_code_and_stderr_tail(
    agent: tuple[AgentHandle, EventLog, LocalTransport],
) -> None:
    """A rank that fails reports its exit code and its last stderr lines."""
    handle, events, _ = agent
    script = "import sys\nfor i in range(3): print('oops', i, file=sys.stderr)\nsys.exit(21)"
    await handle.spawn(Spawn(rank=4, argv=[sys.executable, "-c", script]))
    exited = await events.wait_exit(4)
    assert (exited.returncode, exited.signal, exited.stopped) == (21, None, False)
    assert exited.stderr_tail == ["oops 0", "oops 1", "oops 2"]


async def test_sigterm_ignored_then_sigkill_and_group(
    agent: tuple[AgentHandle, EventLog, LocalTransport],
) -> None:
    """Stop SIGKILLs a rank that ignores SIGTERM, and its children with it (process group)."""
    handle, events, _ = agent
    script = (
        "import os, signal, subprocess, sys, time\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "child = subprocess.Popen(['sleep', '1000'])\n"
        "print('child', child.pid, flush=True)\n"
        "time.sleep(1000)\n"
    )
    spawned = await handle.spawn(Spawn(rank=1, argv=[sys.executable, "-c", script]))
    await events.wait_for(lambda: any(line.startswith("child ") for line in events.lines(1)))
    child = int(next(line for line in events.lines(1) if line.startswith("child ")).split()[1])
    try:
        (exited,) = await handle.stop(1, grace_s=0.5)
        assert exited.signal == "SIGKILL"
        assert await wait_gone(child)
    finally:
        kill_if_alive(child)
        kill_if_alive(spawned.pid)


async def test_rank_env_and_code_path(agent: tuple[AgentHandle, EventLog, LocalTransport]) -> None:
    """Ranks import the deployed code first and see the env they were given (literally)."""
    handle, events, transport = agent
    hostile = "$(touch /tmp/pwned-env); `id`; 'q\" -rf"
    script = "import os, node_agent\nprint(node_agent.__file__)\nprint(os.environ['HOSTILE'])"
    await handle.spawn(Spawn(rank=2, argv=[sys.executable, "-c", script], env={"HOSTILE": hostile}))
    await events.wait_exit(2)
    where, value = events.lines(2, "stdout")
    assert transport._deployed is not None
    assert where.startswith(transport._deployed.code_dir + "/")
    assert value == hostile


async def test_request_errors(
    tmp_path: Path, agent: tuple[AgentHandle, EventLog, LocalTransport]
) -> None:
    """Busy rank, unknown rank, bad cwd and a missing program are refused with codes."""
    handle, _, _ = agent
    spawned = await handle.spawn(Spawn(rank=0, argv=["sleep", "1000"]))
    try:
        with pytest.raises(AgentRequestError) as busy:
            await handle.spawn(Spawn(rank=0, argv=["sleep", "1"]))
        assert busy.value.code == "spawn_failed" and "already running" in busy.value.message
        with pytest.raises(AgentRequestError) as unknown:
            await handle.stop(7)
        assert unknown.value.code == "unknown_rank"
        marker = tmp_path / "pwned-cwd"
        with pytest.raises(AgentRequestError) as bad_cwd:
            await handle.spawn(Spawn(rank=3, argv=["true"], cwd=f"/nonexistent; touch {marker}"))
        assert "not a directory" in bad_cwd.value.message and not marker.exists()
        with pytest.raises(AgentRequestError) as missing:
            await handle.spawn(Spawn(rank=3, argv=[f"no-such-program; touch {marker}"]))
        assert missing.value.code == "spawn_failed" and not marker.exists()
    finally:
        await handle.stop(None, grace_s=1.0)
        kill_if_alive(spawned.pid)


async def test_close_stops_ranks(tmp_path: Path) -> None:
    """Closing the handle (EOF on the agent's stdin) stops every rank and ends the agent."""
    events = EventLog()
    transport = LocalTransport(local_node(), code_cache=tmp_path / "code")
    handle = await transport.start_agent(on_event=events)
    pids = [(await handle.spawn(Spawn(rank=r, argv=["sleep", "1000"]))).pid for r in range(2)]
    try:
        exit_info = await handle.close()
        assert exit_info.exit_status == 0
        assert all(pid_gone(pid) for pid in pids)
        assert handle.hello is not None and await wait_gone(handle.hello.pid)
        assert {e.rank for e in events.events if isinstance(e, Exited) and e.stopped} == {0, 1}
    finally:
        for pid in pids:
            kill_if_alive(pid)
        await transport.close()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux-only")
async def test_agent_sigkill_kills_ranks(tmp_path: Path) -> None:
    """A SIGKILLed agent takes its ranks with it, and the handle reports the loss."""
    transport = LocalTransport(local_node(), code_cache=tmp_path / "code")
    handle = await transport.start_agent()
    rank = (await handle.spawn(Spawn(rank=0, argv=["sleep", "1000"]))).pid
    try:
        assert handle.hello is not None
        os.kill(handle.hello.pid, signal.SIGKILL)
        assert await wait_gone(rank, timeout=5.0)
        lost = await asyncio.wait_for(handle.finished, 15.0)
        assert "closed" in lost.reason
        with pytest.raises(TransportError) as err:
            await handle.ping()
        assert err.value.kind == ErrorKind.AGENT_LOST
    finally:
        kill_if_alive(rank)
        await transport.close()


async def test_hostile_python_does_not_execute(tmp_path: Path) -> None:
    """A python value with shell syntax is one (missing) program name, never a command."""
    marker = tmp_path / "pwned"
    for python in (f"python3; touch {marker}", f"$(touch {marker})"):
        transport = LocalTransport(local_node(python=python), code_cache=tmp_path / "code")
        with pytest.raises(TransportError) as err:
            await transport.start_agent()
        assert err.value.kind == ErrorKind.AGENT_START
        await transport.close()
    option = LocalTransport(local_node(python="-c"), code_cache=tmp_path / "code")
    with pytest.raises(TransportError) as opt_err:
        await option.start_agent()
    assert opt_err.value.kind == ErrorKind.CONFIG
    assert not marker.exists()


async def test_python_without_msgspec_is_explained(tmp_path: Path) -> None:
    """A node python without msgspec fails to start with an install hint."""
    # This python with no site-packages (-S): the stdlib alone, as on a fresh node.
    python = tmp_path / "bare-python"
    python.write_text(f'#!/bin/sh\nexec {sys.executable} -S "$@"\n')
    python.chmod(0o755)
    probe = await asyncio.create_subprocess_exec(python, "-c", "import msgspec")
    assert await probe.wait() != 0, "msgspec importable without site-packages"
    transport = LocalTransport(local_node(python=str(python)), code_cache=tmp_path / "code")
    with pytest.raises(TransportError) as err:
        await transport.start_agent()
    assert err.value.kind == ErrorKind.AGENT_START
    assert "msgspec" in err.value.message and "pip install" in err.value.message
    await transport.close()


async def test_request_timeout_is_a_timeout(
    agent: tuple[AgentHandle, EventLog, LocalTransport],
) -> None:
    """A reply that does not come in time raises TimeoutError; the agent stays usable."""
    handle, events, _ = agent
    script = (
        "import signal, time\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "print('ignoring SIGTERM', flush=True)\n"
        "time.sleep(1000)\n"
    )
    spawned = await handle.spawn(Spawn(rank=0, argv=[sys.executable, "-c", script]))
    try:
        await events.wait_for(lambda: "ignoring SIGTERM" in events.lines(0))
        with pytest.raises(TimeoutError):
            await handle.request(Stop(rank=0, grace_s=2.0), Stopped, timeout=0.2)
        assert (await handle.ping()).ranks == 1
        assert not handle.closed
    finally:
        await handle.stop(None, grace_s=0.1)
        kill_if_alive(spawned.pid)
