"""Two agents (two local "nodes") start an MLX ring group of two ranks that all_sum together."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from contract.agent_protocol import Spawn
from orchestrator.config import NodeSpec
from orchestrator.transports import LocalTransport
from testkit.agent_events import EventLog
from testkit.ports import free_ports

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

RANK = (
    "import mlx.core as mx\n"
    "group = mx.distributed.init(backend='ring', strict=True)\n"
    "total = mx.distributed.all_sum(mx.array([group.rank() + 1.0]))\n"
    "mx.eval(total)\n"
    "print('rank', group.rank(), 'of', group.size(), 'sum', total.item(), flush=True)\n"
)


async def test_ring_group_across_two_agents(tmp_path: Path) -> None:
    """Ranks spawned by two agents with MLX_RANK/MLX_HOSTFILE form one group."""
    hostfile = tmp_path / "hosts.json"
    hostfile.write_text(json.dumps([[f"127.0.0.1:{p}"] for p in free_ports(2)]))
    transports = [
        LocalTransport(NodeSpec(name=f"n{i}", python=sys.executable), code_cache=tmp_path / "code")
        for i in range(2)
    ]
    logs = [EventLog(), EventLog()]
    try:
        agents = [
            await t.start_agent(on_event=log) for t, log in zip(transports, logs, strict=True)
        ]
        for rank, agent in enumerate(agents):
            env = {"MLX_RANK": str(rank), "MLX_HOSTFILE": str(hostfile)}
            env["MLX_LAUNCH_ID"] = "ring-test"
            await agent.spawn(Spawn(rank=rank, argv=[sys.executable, "-c", RANK], env=env))
        for rank, log in enumerate(logs):
            exited = await log.wait_exit(rank, timeout=90.0)
            assert exited.returncode == 0, exited.stderr_tail
            assert f"rank {rank} of 2 sum 3.0" in log.lines(rank, "stdout")
            assert exited.launch_id == "ring-test"
    finally:
        for t in transports:
            await t.close()
