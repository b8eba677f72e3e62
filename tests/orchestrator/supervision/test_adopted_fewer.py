"""A gang adopted on fewer nodes (a previous orchestrator re-planned it without a Mac
asleep) is served as the supervisor's own re-plan: its reason says so, and once the node
answers a planned switch brings every node back (scripted gangs and answers)."""

from __future__ import annotations

from typing import Any

from contract.adoption import LaunchRecord
from orchestrator.placement.remaining import without
from orchestrator.supervision.fewer_nodes import adopted_shrink
from orchestrator.supervision.state import GangState
from testkit.supervisor_harness import FakeGang, Harness, stop

ASLEEP = "timeout: no answer from 10.0.0.3:22 in time"


def adopted(h: Harness, nodes: list[str]) -> FakeGang:
    """The running gang of launch L0 on `nodes`, as adopt_or_clear hands it over."""
    away = [node.name for node in h.spec.nodes if node.name not in nodes]
    gang = FakeGang(without(h.spec, away), "L0", None, h.monitor.on_agent_event)
    gang.record = LaunchRecord(launch_id="L0", config_digest="c", code_digest="k",
                               model_digest="m", nodes=nodes)
    for rank in gang.ranks.values():
        rank.pid = 900 + rank.rank
    gang.adopted = True
    return gang


async def test_an_adopted_gang_on_fewer_nodes_serves_then_every_node_is_back(harness: Any) -> None:
    """Adopted on a and b with c asleep: ready, saying without c; c answers: a gang on
    a, b and c, no restart spent."""
    h: Harness = harness(fewer=True, node_wait_s=30.0)
    h.answers.away_nodes = {"c": ASLEEP}
    first = adopted(h, ["a", "b"])
    h.supervisor.adopt(first)
    await h.until(lambda: h.supervisor.view.state == GangState.READY, "ready on the adopted gang")
    assert "on 2 of 3 nodes, without c (adopted launch L0)" in h.supervisor.view.reason
    assert h.gangs == []  # nothing launched: the adopted gang serves
    h.answers.away_nodes = {}
    full = await h.ready_gang(1)
    assert [launch.node for launch in full.plan.ranks] == ["a", "b", "c"]
    assert not any(rank.running for rank in first.ranks.values())
    assert h.supervisor.view.restarts == 0
    await stop(h)


async def test_a_gang_on_every_node_is_no_re_plan(harness: Any) -> None:
    """A record of every node, or an older one without nodes: nothing to return to."""
    h: Harness = harness(fewer=True)
    every = LaunchRecord(launch_id="L0", config_digest="c", code_digest="k", model_digest="m",
                         nodes=["a", "b", "c"])
    assert adopted_shrink(h.spec, every) is None
    every.nodes = []
    assert adopted_shrink(h.spec, every) is None
    every.nodes = ["a", "c"]
    shrink = adopted_shrink(h.spec, every)
    assert shrink is not None and shrink.away == ("b",) and shrink.nodes == ["a", "c"]
    await stop(h)
