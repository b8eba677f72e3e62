"""Serving on with fewer Macs: the decision once a node is away past node_wait_s (pure, on
a fake clock, fingerprints made here), and the loop that serves on the nodes that remain
and goes back to every node once it answers (scripted gangs and answers)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from contract.fingerprint import (
    ManifestFile,
    MemoryInfo,
    ModelInfo,
    NodeFingerprint,
    OsInfo,
    PythonInfo,
)
from contract.model_config import config_info
from contract.model_shards import WeightShard
from orchestrator.config import ClusterSpec, ConfigErrors
from orchestrator.config.load import check_cluster_data
from orchestrator.launch.gang import Gang
from orchestrator.launch.plan import build_plan
from orchestrator.placement.remaining import without
from orchestrator.supervision.failures import Cause
from orchestrator.supervision.fewer_nodes import FewerNodes, KeepWaiting, Shrink, decide_away
from orchestrator.supervision.node_wait import NodeWait
from orchestrator.supervision.recovery import Fail
from orchestrator.supervision.state import GangState
from orchestrator.transports import AgentExit
from testkit.fake_clock import FakeClock
from testkit.model_configs import SMOLLM2
from testkit.supervisor_harness import FakeAnswers, Harness, stop

GIB = 1024**3
NODE_WAIT_S = 30.0
ASLEEP = "timeout: no answer from 10.0.0.3:22 in time"


def spec(nodes: int = 3, **cluster: str) -> ClusterSpec:
    data = {
        "cluster": cluster,
        "nodes": [{"name": f"n{i}", "ip": "127.0.0.1"} for i in range(nodes)],
        "preflight": {"reserve_memory_gb": 0},
        "supervisor": {"node_wait_s": NODE_WAIT_S},
    }
    return check_cluster_data(data, Path("cluster.toml"))[0]


def fingerprint(memory_gib: float = 16, files: list[str] | None = None,
                shards: list[WeightShard] | None = None) -> NodeFingerprint:
    memory = int(memory_gib * GIB)
    return NodeFingerprint(
        hostname="h",
        os=OsInfo(system="Linux", name="Linux", version="1", kernel="1"),
        arch="arm64",
        memory=MemoryInfo(total_bytes=memory, available_bytes=memory),
        python=PythonInfo(version="3.12.0", executable="python3", implementation="CPython"),
        model=ModelInfo(
            spec="m", exists=True, kind="mlx_dir", weight_bytes=270_000_000,
            config=config_info(SMOLLM2),
            files=[ManifestFile(path=p, size=1, sha256=p) for p in files or []],
            shards=shards,
        ),
    )


def away_for(seconds: float, *names: str) -> NodeWait:
    """Nodes `names` away for `seconds` on a fake clock."""
    clock = FakeClock()
    wait = NodeWait(NODE_WAIT_S, clock)
    wait.update({name: ASLEEP for name in names})
    clock.advance(seconds)
    return wait


def test_a_node_away_waits_until_node_wait_s_then_the_rest_serve_re_split() -> None:
    """n2 of three away: waiting before node_wait_s; past it, pipeline on n0 and n1 with
    the 30 layers split between them by memory (n0 twice n1: about 20 : 10)."""
    cluster = spec(3, parallel="pipeline")
    prints = {"n0": fingerprint(16), "n1": fingerprint(8), "n2": fingerprint(8)}
    early = decide_away(away_for(NODE_WAIT_S - 1, "n2"), cluster, prints, enabled=True)
    assert isinstance(early, KeepWaiting) and early.reason.startswith("waiting for node n2")
    shrink = decide_away(away_for(NODE_WAIT_S, "n2"), cluster, prints, enabled=True)
    assert isinstance(shrink, Shrink), shrink
    assert shrink.nodes == ["n0", "n1"] and shrink.away == ("n2",)
    assert shrink.spec.world_size == 2 and len(cluster.nodes) == 3  # cluster.toml's untouched
    assert shrink.placement is not None and shrink.placement.mode == "pipeline"
    split = shrink.placement.pipeline_split
    assert split is not None and sum(split) == 30 and 18 <= split[0] <= 22, split
    assert shrink.reason.startswith("on 2 of 3 nodes, without n2 (away since ")


def test_rank_0s_node_away_moves_rank_0_to_the_next() -> None:
    """n0 away (it ran rank 0 and the API): the rest serve with n1 as rank 0."""
    cluster = spec(2)
    prints = {"n0": fingerprint(), "n1": fingerprint()}
    shrink = decide_away(away_for(NODE_WAIT_S, "n0"), cluster, prints, enabled=True)
    assert isinstance(shrink, Shrink) and shrink.nodes == ["n1"]
    assert shrink.placement is not None and shrink.placement.ranks[0].node == "n1"


def test_tensor_only_when_the_remaining_ranks_divide_the_heads() -> None:
    """SmolLM2's 9 heads / 3 KV heads on 3 ranks, one away: 2 ranks cannot split them, so
    tensor fails as before with the reason; auto serves on in pipeline mode."""
    prints = {f"n{i}": fingerprint() for i in range(3)}
    tensor = decide_away(away_for(NODE_WAIT_S, "n1"), spec(3, parallel="tensor"), prints, True)
    assert isinstance(tensor, Fail), tensor
    assert "longer than node_wait_s (30 s)" in tensor.reason
    assert "cannot be served on the rest (n0, n2): the model's 9 attention heads" in tensor.reason
    auto = decide_away(away_for(NODE_WAIT_S, "n1"), spec(3, parallel="auto"), prints, True)
    assert isinstance(auto, Shrink) and auto.placement is not None
    assert auto.placement.mode == "pipeline" and auto.nodes == ["n0", "n2"]


def test_setting_off_fails_past_node_wait_s_exactly_as_before() -> None:
    """serve_on_fewer_nodes = false: the old failure, word for word."""
    wait = away_for(NODE_WAIT_S, "n2")
    prints = {f"n{i}": fingerprint() for i in range(3)}
    assert decide_away(wait, spec(3), prints, enabled=False) == Fail(wait.failed_reason())


def test_a_model_that_does_not_fit_the_rest_fails_with_the_numbers() -> None:
    """Two 0.4 GiB nodes hold the model only together: one away fails, saying what the
    other would need and may use."""
    cluster = spec(2, parallel="pipeline")
    prints = {"n0": fingerprint(0.4), "n1": fingerprint(0.4)}
    result = decide_away(away_for(NODE_WAIT_S, "n1"), cluster, prints, enabled=True)
    assert isinstance(result, Fail), result
    assert "unreachable since" in result.reason and "does not fit" in result.reason
    assert "n0 needs" in result.reason and "may use 0.4 GiB" in result.reason


def test_a_node_lacking_the_shards_of_its_new_layers_keeps_waiting_saying_why() -> None:
    """[model] sync sent each node only its layers' shards: n0 cannot take n1's layers, so
    the cluster keeps waiting for n1 (not failed), naming the files n0 lacks."""
    shards = [WeightShard(path="a.safetensors", layers=list(range(15)), shared=True),
              WeightShard(path="b.safetensors", layers=list(range(15, 30)))]
    common = ["config.json", "model.safetensors.index.json"]
    prints = {"n0": fingerprint(files=[*common, "b.safetensors"], shards=shards),
              "n1": fingerprint(files=[*common, "a.safetensors"], shards=shards)}
    cluster = spec(2, parallel="pipeline")
    result = decide_away(away_for(NODE_WAIT_S * 10, "n1"), cluster, prints, enabled=True)
    assert isinstance(result, KeepWaiting), result
    assert result.reason.startswith("waiting for node n1: unreachable since ")
    assert "past node_wait_s" in result.reason and "a.safetensors" in result.reason


def fewer_harness(harness: Any, **supervisor: Any) -> Harness:
    h: Harness = harness(fewer=True, node_wait_s=NODE_WAIT_S, **supervisor)
    for name in h.pool.nodes:
        h.pool.nodes[name].fingerprint = fingerprint()
    return h


async def test_the_loop_serves_on_fewer_nodes_then_back_on_every_node(harness) -> None:
    """c asleep past node_wait_s: a gang on a and b serves (reason says so, no restart
    spent); c answers: a planned switch to a gang on a, b and c, still no restart spent."""
    h = fewer_harness(harness)
    await h.ready_gang(1)
    h.answers.away_nodes = {"c": ASLEEP}
    h.monitor.on_agent_lost("c", AgentExit("the agent did not answer a ping within 15 s", None, []))
    fewer = await h.ready_gang(2)
    assert [launch.node for launch in fewer.plan.ranks] == ["a", "b"]
    assert h.launched_at[-1] - h.supervisor.view.snapshot().history[-1].root.at >= NODE_WAIT_S
    assert "on 2 of 3 nodes, without c (away since " in h.supervisor.view.reason
    assert any(r.startswith("waiting: waiting for node c") for r in h.reasons)
    h.answers.away_nodes = {}
    full = await h.ready_gang(3)
    assert [launch.node for launch in full.plan.ranks] == ["a", "b", "c"]
    assert not any(rank.running for rank in fewer.ranks.values())  # stopped, then replaced
    assert any("c answers again: back to every node" in r for r in h.reasons)
    assert h.supervisor.view.restarts == 0 and h.restarts(Cause.AGENT_LOST) == 0
    assert (await stop(h)).restarts == 0


async def test_the_loop_with_the_setting_off_fails_past_node_wait_s(harness) -> None:
    """serve_on_fewer_nodes = false: failed past node_wait_s, no gang on fewer nodes."""
    h = fewer_harness(harness, serve_on_fewer_nodes=False)
    await h.ready_gang(1)
    h.answers.away_nodes = {"c": ASLEEP}
    h.monitor.on_agent_lost("c", AgentExit("lost", None, []))
    await h.until(lambda: h.supervisor.view.state == GangState.FAILED, "failed")
    assert "longer than node_wait_s (30 s)" in h.supervisor.view.reason
    assert len(h.gangs) == 1
    await stop(h)


def test_ranks_left_on_a_node_away_are_reaped_once_it_is_back() -> None:
    """The full gang's unconfirmed rank on n1 (away) is not asked of n1 while the gang runs
    on n0 alone; it is handed for reaping at the launch back on every node."""
    cluster = spec(2)
    full = Gang(build_plan(cluster, "L1"), pool=None)  # type: ignore[arg-type]
    for rank in full.ranks.values():
        rank.pid = 100 + rank.rank
    fewer = FewerNodes(cluster, None, FakeAnswers(), FakeClock().sleep, 1.0)
    prints = {"n0": fingerprint(), "n1": fingerprint()}
    shrink = decide_away(away_for(NODE_WAIT_S, "n1"), cluster, prints, enabled=True)
    assert isinstance(shrink, Shrink)
    fewer.shrink(shrink)
    assert [r.node for r in fewer.stale(full)] == ["n0"]
    fewer.restore()
    assert [(r.node, r.pid) for r in fewer.stale(None)] == [("n1", 101)]
    assert fewer.stale(None) == []


def test_the_setting_is_on_by_default_and_checked_with_its_field_path() -> None:
    """serve_on_fewer_nodes: true unless set; a non-bool names the field and the fix."""
    assert spec(2).supervisor.serve_on_fewer_nodes is True
    data = {"nodes": [{"name": "a"}], "supervisor": {"serve_on_fewer_nodes": "yes"}}
    with pytest.raises(ConfigErrors) as raised:
        check_cluster_data(data, Path("cluster.toml"))
    assert "supervisor.serve_on_fewer_nodes: 'yes' is not valid" in str(raised.value)
    assert "use true or false" in str(raised.value)


def test_a_jaccl_mesh_keeps_each_remaining_nodes_devices_towards_the_remaining_ranks() -> None:
    """n1 of a 3-node jaccl mesh away: n0 and n2 keep their devices towards each other."""
    data = {
        "cluster": {"backend": "jaccl"},
        "nodes": [{"name": f"n{i}", "ip": f"10.0.0.{i + 1}",
                   "rdma": [None if j == i else f"rdma_en{j}" for j in range(3)]}
                  for i in range(3)],
    }
    cluster = check_cluster_data(data, Path("cluster.toml"))[0]
    fewer = without(cluster, ["n1"])
    assert [node.rdma for node in fewer.nodes] == [[None, "rdma_en2"], ["rdma_en0", None]]
    assert len(cluster.nodes[0].rdma or []) == 3  # cluster.toml's spec untouched
