"""A rank that watches its agent exits when the agent is gone (the macOS gap's cover)."""

from __future__ import annotations

import asyncio
import signal
import sys
from pathlib import Path

from testkit import paths
from testkit.agent_events import kill_if_alive, wait_gone

ROOT = paths.ROOT

# The "agent": starts a rank in its own session, reports its pid, waits.
AGENT = (
    "import subprocess, sys, time\n"
    "rank = subprocess.Popen([sys.executable, '-c', sys.argv[1]], start_new_session=True)\n"
    "print(rank.pid, flush=True)\n"
    "time.sleep(1000)\n"
)
# The "rank": watches the agent (its parent), then sleeps; a child shares its group.
RANK = (
    "import os, subprocess, time\n"
    "from serving.rank.parent_watch import watch_agent\n"
    "child = subprocess.Popen(['sleep', '1000'])\n"
    "open(os.environ['CHILD_FILE'], 'w').write(str(child.pid))\n"
    "watch_agent(os.getppid())\n"
    "time.sleep(1000)\n"
)


async def test_rank_and_its_group_exit_when_the_agent_dies(tmp_path: Path) -> None:
    """SIGKILL the agent: the watching rank ends its process group and exits."""
    child_file = tmp_path / "child"
    agent = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        AGENT,
        RANK,
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "CHILD_FILE": str(child_file)},
    )
    assert agent.stdout is not None
    rank = int(await asyncio.wait_for(agent.stdout.readline(), 10))
    child = 0
    try:
        for _ in range(200):
            if child_file.exists() and child_file.read_text():
                break
            await asyncio.sleep(0.05)
        child = int(child_file.read_text())
        agent.send_signal(signal.SIGKILL)
        await agent.wait()
        assert await wait_gone(rank, timeout=10.0)
        assert await wait_gone(child, timeout=10.0)
    finally:
        kill_if_alive(agent.pid)
        kill_if_alive(rank)
        if child:
            kill_if_alive(child)
