"""When a new `up` may adopt the gang the agents kept (orchestrator/launch/adoption.py):
the same launch on every node, every rank running, and the same cluster.toml, rank code
and model; otherwise it says why, and the gang is ended and launched afresh."""

from __future__ import annotations

from pathlib import Path

from msgspec import structs

from contract.adoption import LaunchRecord
from contract.agent_protocol import RankInfo, RankList
from orchestrator.config import ClusterSpec, load_cluster
from orchestrator.launch.adoption import config_digest, mismatch, model_digest, rank_code_digest
from testkit.orchestrator_process import write_cluster

NODES = [{"name": f"r{i}", "ip": "127.0.0.1"} for i in range(2)]


def _spec(tmp_path: Path) -> ClusterSpec:
    return load_cluster(write_cluster(tmp_path, "bundled:smollm2-135m-instruct", NODES))


def _record(spec: ClusterSpec, launch_id: str = "L1") -> LaunchRecord:
    return LaunchRecord(launch_id=launch_id, config_digest=config_digest(spec),
                        code_digest=rank_code_digest(), model_digest=model_digest(spec, {}))


def _states(spec: ClusterSpec, records: list[LaunchRecord | None]) -> dict[str, RankList]:
    """Node i runs rank i of its record's launch."""
    return {
        node.name: RankList(id=1, launch=record, ranks=[RankInfo(
            rank=i, pid=100 + i, launch_id=record.launch_id if record else None, started_at=0.0)])
        for i, (node, record) in enumerate(zip(spec.nodes, records, strict=True))
    }


def test_the_gang_an_unchanged_cluster_left_is_adopted(tmp_path: Path) -> None:
    spec = _spec(tmp_path)
    assert mismatch(spec, _states(spec, [_record(spec)] * 2), {}) == ""


def test_a_changed_cluster_toml_is_not_adopted(tmp_path: Path) -> None:
    spec = _spec(tmp_path)
    running = _states(spec, [_record(spec)] * 2)
    changed = structs.replace(spec, supervisor=structs.replace(
        spec.supervisor, stop_grace_s=spec.supervisor.stop_grace_s + 1))
    assert mismatch(changed, running, {}).startswith("cluster.toml changed since launch L1")


def test_a_gang_missing_a_rank_or_split_across_launches_is_not_adopted(tmp_path: Path) -> None:
    spec = _spec(tmp_path)
    one_gone = _states(spec, [_record(spec)] * 2)
    one_gone["r1"].ranks.clear()
    assert mismatch(spec, one_gone, {}) == "rank 1 of launch L1 no longer runs on r1"
    two = _states(spec, [_record(spec, "L1"), _record(spec, "L2")])
    assert mismatch(spec, two, {}) == "the nodes run different launches (L1, L2)"
    unrecorded = _states(spec, [_record(spec), None])
    assert mismatch(spec, unrecorded, {}) == (
        "the agent on r1 runs ranks but keeps no launch record")
