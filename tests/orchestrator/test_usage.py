"""Live node usage: an agent's reports follow a rank's memory; stale reports are withheld."""

from __future__ import annotations

import sys
from pathlib import Path

from contract.agent_protocol import NodeUsage, Spawn
from contract.fingerprint import MemoryInfo
from orchestrator.config import NodeSpec
from orchestrator.transports import LocalTransport
from orchestrator.transports.pool import USAGE_STALE_S, NodeConnection
from orchestrator.usage_metrics import NodeUsageCollector
from testkit.agent_events import EventLog

# A rank that takes 600 MB (every page touched) once the file named by argv[1] exists.
GROWS = (
    "import os, sys, time\n"
    "while not os.path.exists(sys.argv[1]): time.sleep(0.05)\n"
    "held = bytearray(b'x' * (600 << 20))\n"
    "print('holding', len(held), flush=True)\n"
    "time.sleep(1000)\n"
)


def rank_rss(events: EventLog) -> list[int]:
    return [e.ranks[0].rss_bytes for e in events.events if isinstance(e, NodeUsage) and e.ranks]


def available(events: EventLog) -> list[int]:
    return [e.memory.available_bytes for e in events.events if isinstance(e, NodeUsage)]


async def test_usage_reports_follow_a_rank_that_allocates(tmp_path: Path) -> None:
    """Reports every 0.3 s carry the node's memory and the rank's RSS: the rank's RSS grows
    and the node's available memory shrinks by the 600 MB the rank takes, within seconds."""
    events = EventLog()
    async with LocalTransport(NodeSpec(name="n"), code_cache=tmp_path / "code") as transport:
        agent = await transport.start_agent(on_event=events)
        go = tmp_path / "go"
        await agent.spawn(Spawn(rank=0, argv=[sys.executable, "-c", GROWS, str(go)]))
        await agent.watch_usage(0.3)
        await events.wait_for(lambda: len(rank_rss(events)) >= 2)
        before, free_before = max(rank_rss(events)), available(events)[-1]
        go.touch()
        await events.wait_for(lambda: max(rank_rss(events)) > before + 550e6, timeout=10)
        await events.wait_for(lambda: available(events)[-1] < free_before - 400e6, timeout=10)
        usage = [e for e in events.events if isinstance(e, NodeUsage)][-1]
        assert usage.memory.total_bytes > usage.memory.available_bytes > 0
        assert usage.load_1m is not None and usage.cpu_count
        await agent.stop(0, grace_s=2)


def test_a_stale_report_exports_no_figures_only_its_age() -> None:
    """A node whose agent went silent: no memory samples (not the last number), its age."""
    usage = NodeUsage(memory=MemoryInfo(total_bytes=8 << 30, available_bytes=4 << 30))
    fresh = NodeConnection(NodeSpec(name="fresh"), usage=usage, usage_at=100.0)
    long_ago = 100.0 - USAGE_STALE_S - 5
    silent = NodeConnection(NodeSpec(name="silent"), usage=usage, usage_at=long_ago)
    collector = NodeUsageCollector({"fresh": fresh, "silent": silent}, clock=lambda: 100.0)
    samples = [s for family in collector.collect() for s in family.samples]
    memory = {s.labels["node"] for s in samples if s.name == "orchestrator_node_memory_bytes"}
    ages = {s.labels["node"]: s.value for s in samples if s.name.endswith("age_seconds")}
    assert memory == {"fresh"}
    assert ages == {"fresh": 0.0, "silent": USAGE_STALE_S + 5}
