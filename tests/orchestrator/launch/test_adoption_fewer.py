"""Adopting a gang a previous orchestrator re-planned on fewer nodes (a Mac asleep, the
rest serving): its launch record names the nodes it runs on, and a new `up` adopts it with
the node left out unreachable; a record that does not fit cluster.toml is refused."""

from __future__ import annotations

from pathlib import Path

from contract.adoption import LaunchRecord
from contract.agent_protocol import RankInfo, RankList
from orchestrator.config import ClusterSpec, load_cluster
from orchestrator.launch.adoption import gang_spec, launch_record, mismatch
from orchestrator.launch.plan import build_plan
from orchestrator.placement.remaining import without
from testkit.orchestrator_process import write_cluster

NODES = [{"name": f"r{i}", "ip": "127.0.0.1"} for i in range(3)]


def _spec(tmp_path: Path) -> ClusterSpec:
    return load_cluster(write_cluster(tmp_path, "bundled:smollm2-135m-instruct", NODES))


def _fewer_record(spec: ClusterSpec, away: str = "r1") -> LaunchRecord:
    """The record `up` gives the gang it re-planned without `away`."""
    fewer = without(spec, [away])
    return launch_record(spec, build_plan(fewer, "L1"), {}, fewer)


def _running(record: LaunchRecord, nodes: list[str]) -> dict[str, RankList]:
    """Rank i on nodes[i] (the nodes the new `up` reached), all of launch L1."""
    return {name: RankList(id=1, launch=record, ranks=[RankInfo(
        rank=i, pid=100 + i, launch_id=record.launch_id, started_at=0.0)])
        for i, name in enumerate(nodes)}


def test_the_record_names_the_nodes_the_gang_runs_on(tmp_path: Path) -> None:
    """Re-planned without r1: the record says r0, r2 and keeps cluster.toml's digest."""
    spec = _spec(tmp_path)
    record = _fewer_record(spec)
    assert record.nodes == ["r0", "r2"]
    every = launch_record(spec, build_plan(spec, "L2"), {})
    assert every.nodes == ["r0", "r1", "r2"] and every.config_digest == record.config_digest
    fewer = gang_spec(spec, record)
    assert not isinstance(fewer, str) and [n.name for n in fewer.nodes] == ["r0", "r2"]


def test_a_gang_re_planned_on_fewer_nodes_is_adopted_with_the_node_away(tmp_path: Path) -> None:
    """r1 asleep (no reply from it): ranks 0 and 1 of L1 on r0 and r2 are adopted."""
    spec = _spec(tmp_path)
    record = _fewer_record(spec)
    assert mismatch(spec, _running(record, ["r0", "r2"]), {}) == ""


def test_a_re_planned_gang_missing_a_rank_is_not_adopted(tmp_path: Path) -> None:
    """Its rank 1 (on r2) gone: refused, naming rank and node as for a full gang."""
    spec = _spec(tmp_path)
    record = _fewer_record(spec)
    running = _running(record, ["r0", "r2"])
    running["r2"].ranks.clear()
    assert mismatch(spec, running, {}) == "rank 1 of launch L1 no longer runs on r2"


def test_a_record_whose_nodes_cluster_toml_does_not_name_is_refused(tmp_path: Path) -> None:
    """The gang ran on r0 and r9 (cluster.toml changed since): refused, naming both."""
    spec = _spec(tmp_path)
    record = _fewer_record(spec)
    record.nodes = ["r0", "r9"]
    assert mismatch(spec, _running(record, ["r0"]), {}) == (
        "launch L1 runs on r0, r9: not nodes of cluster.toml (r0, r1, r2) in their order")
    record.nodes = ["r2", "r0"]
    assert "not nodes of cluster.toml" in mismatch(spec, _running(record, ["r2", "r0"]), {})


def test_an_older_record_without_nodes_means_every_node(tmp_path: Path) -> None:
    """A record from before the field: the gang of every node, checked as before."""
    spec = _spec(tmp_path)
    record = launch_record(spec, build_plan(spec, "L1"), {})
    record.nodes = []
    assert gang_spec(spec, record) is spec
    assert mismatch(spec, _running(record, ["r0", "r1", "r2"]), {}) == ""
    assert mismatch(spec, _running(record, ["r0", "r2"]), {}) == (
        "rank 1 of launch L1 no longer runs on r1")
