"""Standby ranks: started ahead, held until a matching Spawn adopts them, discarded otherwise."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from contract.agent_protocol import Spawn, Spawned
from orchestrator.config import NodeSpec
from orchestrator.transports import AgentHandle, LocalTransport
from testkit.agent_events import EventLog, kill_if_alive, pid_gone, wait_gone

pytestmark = pytest.mark.e2e

# Like `python -m serving`: as a standby it waits for "go" on stdin before its real work.
HELD_RANK = [
    sys.executable,
    "-u",
    "-c",
    "import os, sys, time\n"
    "if os.environ.get('ORCHESTRATOR_STANDBY') and sys.stdin.readline() != 'go\\n':\n"
    "    sys.exit(0)\n"
    "print('running', os.getpid(), os.environ['MLX_LAUNCH_ID'], open('settings').read())\n"
    "time.sleep(1000)\n",
]


@pytest.fixture
async def agent(tmp_path: Path) -> AsyncIterator[tuple[AgentHandle, EventLog]]:
    events = EventLog()
    transport = LocalTransport(NodeSpec(name="local0"), code_cache=tmp_path / "code")
    handle = await transport.start_agent(on_event=events)
    try:
        yield handle, events
    finally:
        await transport.close()


def request(tmp_path: Path, launch_id: str, standby: bool = False) -> Spawn:
    return Spawn(
        rank=1,
        argv=HELD_RANK,
        cwd=str(tmp_path / launch_id),
        files={"settings": f"settings of {launch_id}"},
        env={"MLX_LAUNCH_ID": launch_id},
        standby=standby,
    )


async def spawn(handle: AgentHandle, req: Spawn) -> int:
    return (await handle.request(req, Spawned, 30)).pid


async def test_matching_spawn_adopts_the_standby(
    agent: tuple[AgentHandle, EventLog], tmp_path: Path
) -> None:
    """The standby waits (no output, not a rank); the real Spawn runs that same process."""
    handle, events = agent
    held = await spawn(handle, request(tmp_path, "L2", standby=True))
    try:
        assert not pid_gone(held)
        assert await handle.list_ranks() == [] and events.lines(1) == []
        assert (tmp_path / "L2" / "settings").read_text() == "settings of L2"
        assert await spawn(handle, request(tmp_path, "L2")) == held
        await events.wait_for(lambda: events.lines(1) == [f"running {held} L2 settings of L2"])
        assert [info.pid for info in await handle.list_ranks()] == [held]
        (exited,) = await handle.stop(1, grace_s=1.0)
        assert exited.pid == held and exited.launch_id == "L2" and exited.stopped
    finally:
        kill_if_alive(held)


async def test_a_standby_starts_while_the_rank_runs(
    agent: tuple[AgentHandle, EventLog], tmp_path: Path
) -> None:
    """The next launch's standby is started beside the rank of the current launch."""
    handle, _events = agent
    running = await spawn(handle, request(tmp_path, "L1"))
    held = await spawn(handle, request(tmp_path, "L2", standby=True))
    try:
        assert held != running and not pid_gone(running) and not pid_gone(held)
        await handle.stop(1, grace_s=1.0)
        assert await spawn(handle, request(tmp_path, "L2")) == held
    finally:
        await handle.stop(None, grace_s=1.0)
        kill_if_alive(running)
        kill_if_alive(held)


async def test_a_different_launch_discards_the_standby(
    agent: tuple[AgentHandle, EventLog], tmp_path: Path
) -> None:
    """A Spawn the standby was not started for gets a fresh process; the standby ends."""
    handle, events = agent
    held = await spawn(handle, request(tmp_path, "L2", standby=True))
    fresh = await spawn(handle, request(tmp_path, "L3"))
    try:
        assert fresh != held and await wait_gone(held)
        await events.wait_for(lambda: events.lines(1) == [f"running {fresh} L3 settings of L3"])
    finally:
        await handle.stop(None, grace_s=1.0)
        kill_if_alive(held)
        kill_if_alive(fresh)


async def test_a_new_standby_replaces_the_old_and_close_ends_it(tmp_path: Path) -> None:
    """One standby per rank; closing the agent ends the standby that is left."""
    transport = LocalTransport(NodeSpec(name="local0"), code_cache=tmp_path / "code")
    handle = await transport.start_agent()
    first = await spawn(handle, request(tmp_path, "L2", standby=True))
    second = await spawn(handle, request(tmp_path, "L3", standby=True))
    try:
        assert await wait_gone(first) and not pid_gone(second)
        await handle.close()
        assert await wait_gone(second)
    finally:
        kill_if_alive(first)
        kill_if_alive(second)
        await transport.close()
