"""When a new `up` may adopt the gang the agents kept (orchestrator/launch/adoption.py):
the same launch on every node, every rank running, and the same cluster.toml, rank code
and model; otherwise it says why, and the gang is ended and launched afresh."""

from __future__ import annotations

from pathlib import Path

from msgspec import structs

from contract.adoption import LaunchRecord
from contract.agent_protocol import RankInfo, RankList
from contract.fingerprint import ModelInfo, NodeFingerprint, OsInfo, PythonInfo
from node_agent.code_digest import code_digest, package_files
from orchestrator.config import ClusterSpec, load_cluster
from orchestrator.launch import launch_secret
from orchestrator.launch.adoption import (
    RANK_PACKAGES,
    _kept_secret,
    config_digest,
    mismatch,
    model_digest,
    rank_code_digest,
)
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


def _fingerprint(model_digest: str) -> NodeFingerprint:
    """A node holding the model whose manifest digest is `model_digest`."""
    return NodeFingerprint(
        hostname="h", os=OsInfo(system="Linux", name="L", version="1", kernel="k"), arch="x",
        python=PythonInfo(version="3.11.0", executable="p", implementation="CPython"),
        model=ModelInfo(spec="/m", path="/m", exists=True, kind="mlx_dir", digest=model_digest))


def test_a_gang_whose_model_files_changed_is_not_adopted(tmp_path: Path) -> None:
    """Launched on model digest aaaa on both nodes; r1 now holds bbbb: refused (it would
    serve the weights it loaded, not the ones on disk). The same digests: adopted."""
    spec = _spec(tmp_path)
    then = {name: _fingerprint("aaaa") for name in ("r0", "r1")}
    record = structs.replace(_record(spec), model_digest=model_digest(spec, then))
    running = _states(spec, [record] * 2)
    assert mismatch(spec, running, then) == ""
    now = {**then, "r1": _fingerprint("bbbb")}
    assert mismatch(spec, running, now).startswith("the model files changed since launch L1")


def test_a_gang_whose_rank_code_changed_is_not_adopted(tmp_path: Path) -> None:
    """The record's code digest is another than the ranks' code here now: refused."""
    spec = _spec(tmp_path)
    record = structs.replace(_record(spec), code_digest="0123456789abcdef")
    why = mismatch(spec, _states(spec, [record] * 2), {})
    assert why.startswith("the ranks' code (contract, serving) changed since launch L1"), why


def test_the_rank_code_digest_follows_serving_and_contract_only(tmp_path: Path) -> None:
    """An edit under serving/ or contract/ changes the digest the record keeps; one under
    orchestrator/ or node_agent/ leaves the ranks adoptable."""
    for package in ("contract", "serving", "orchestrator", "node_agent"):
        (tmp_path / package).mkdir()
        (tmp_path / package / "m.py").write_text("x = 1\n")

    def digest() -> str:
        return code_digest(tmp_path, package_files(tmp_path, RANK_PACKAGES))

    before = digest()
    for package in ("orchestrator", "node_agent"):
        (tmp_path / package / "m.py").write_text("x = 2\n")
    assert digest() == before
    for package in ("serving", "contract"):
        (tmp_path / package / "m.py").write_text(f"x = 3  # {package}\n")
        assert digest() != before, package
        before = digest()


def test_adoption_needs_the_kept_secret_owner_only_and_for_that_launch(tmp_path: Path) -> None:
    """Rank 0's secret as the head kept it: none kept, another launch's, or a file others
    may read (mode 0644) each refuse adoption with the reason; a 0600 one for L1 is used."""
    spec = _spec(tmp_path)
    assert _kept_secret(spec, "L1")[1].startswith("this machine keeps no secret for launch L1")
    launch_secret.save(spec.state_dir, spec.cluster.name,
                       launch_secret.LaunchSecret(launch_id="L0", secret="s0"))
    assert _kept_secret(spec, "L1")[1].startswith("this machine keeps no secret for launch L1")
    launch_secret.save(spec.state_dir, spec.cluster.name,
                       launch_secret.LaunchSecret(launch_id="L1", secret="s1"))
    kept, why = _kept_secret(spec, "L1")
    assert kept is not None and kept.secret == "s1" and why == ""
    launch_secret.secret_path(spec.state_dir, spec.cluster.name).chmod(0o644)
    kept, why = _kept_secret(spec, "L1")
    assert kept is None and "is readable by others (mode 644)" in why, why
