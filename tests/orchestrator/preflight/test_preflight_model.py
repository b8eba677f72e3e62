"""Preflight's model check in pipeline mode: nodes holding only their stage's shards pass;
a node lacking one of its shards, or a file that differs between nodes, is named; `up`
checks the split sync sent."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from contract.fingerprint import ModelInfo, NodeFingerprint, OsInfo, PythonInfo
from contract.model_manifest import ManifestFile
from contract.model_shards import WeightShard
from contract.placement import Placement, RankShare
from orchestrator.config import ClusterSpec
from orchestrator.config.load import check_cluster_data
from orchestrator.preflight.model import model_preflight
from orchestrator.provision.sync import up_sync as up_sync_module
from orchestrator.provision.sync.model_sync import SyncReport

SHARDS = [
    WeightShard(path="s0.safetensors", layers=[], shared=True),
    WeightShard(path="s1.safetensors", layers=[0, 1]),
    WeightShard(path="s2.safetensors", layers=[2, 3]),
]
COMMON = ["config.json", "model.safetensors.index.json", "s0.safetensors"]
PIPELINE = Placement(mode="pipeline", reason="", layer_count=4, ranks=[
    RankShare(rank=0, node="n0", layers=(2, 4), weight_bytes=1, kv_bytes=1),
    RankShare(rank=1, node="n1", layers=(0, 2), weight_bytes=1, kv_bytes=1),
])


def spec() -> ClusterSpec:
    nodes = [{"name": n, "ip": "127.0.0.1"} for n in ("n0", "n1")]
    data = {"model": {"path": "/m"}, "nodes": nodes}
    return check_cluster_data(data, Path("test.toml"))[0]


def node(files: list[str], sha: str = "a") -> NodeFingerprint:
    listed = [ManifestFile(path=p, size=1, sha256=sha if p == "s2.safetensors" else "x")
              for p in files]
    model = ModelInfo(spec="/m", path="/m", exists=True, kind="mlx_dir", digest="d" + str(files),
                      files=listed, shards=SHARDS)
    return NodeFingerprint(hostname="h", os=OsInfo(system="Linux", name="L", version="1",
                           kernel="k"), arch="x", python=PythonInfo(version="3.11.0",
                           executable="p", implementation="CPython"), model=model)


def found(prints: dict[str, NodeFingerprint], placement: object) -> list[tuple[str, str]]:
    return [(f.node, f.found) for f in model_preflight(spec(), prints, placement)]


def test_each_node_holding_its_stages_shards_passes() -> None:
    """Different subsets (so different whole-directory digests) are not a difference."""
    prints = {"n0": node([*COMMON, "s2.safetensors"]), "n1": node([*COMMON, "s1.safetensors"])}
    assert found(prints, PIPELINE) == []


def test_a_missing_shard_names_node_layers_and_file() -> None:
    """n0 without s2: it lacks a file for its layers [2, 4); in tensor mode both lack."""
    prints = {"n0": node(COMMON), "n1": node([*COMMON, "s1.safetensors"])}
    assert found(prints, PIPELINE) == [
        ("n0", "lacks 1 of the model's files it needs for its layers [2, 4): s2.safetensors")
    ]
    tensor = [n for n, _ in found(prints, None)]
    assert tensor == ["n0", "n1"]


def test_a_file_that_differs_between_nodes_is_named() -> None:
    """Both hold s2 with different SHA-256s: one cluster-wide failure naming the file."""
    prints = {"n0": node([*COMMON, "s2.safetensors"], "a" * 64),
              "n1": node([*COMMON, "s1.safetensors", "s2.safetensors"], "b" * 64)}
    (failure,) = found(prints, PIPELINE)
    assert failure[0] == "*" and "s2.safetensors (n0: aaaa" in failure[1], failure


def test_up_checks_the_split_sync_sent_not_one_decided_again(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Split drift: a split decided again after sync (a boundary layer moved to n0) would
    find n0 lacking s1; `up` gets sync's own split from sync_for_up and preflight passes."""
    prints = {"n0": node([*COMMON, "s2.safetensors"]), "n1": node([*COMMON, "s1.safetensors"])}
    drifted = Placement(mode="pipeline", reason="", layer_count=4, ranks=[
        RankShare(rank=0, node="n0", layers=(1, 4), weight_bytes=1, kv_bytes=1),
        RankShare(rank=1, node="n1", layers=(0, 1), weight_bytes=1, kv_bytes=1),
    ])
    assert [n for n, _ in found(prints, drifted)] == ["n0"]

    async def synced(*args: object) -> SyncReport:
        return SyncReport(path="/m", source="this machine", placement=PIPELINE)

    monkeypatch.setattr(up_sync_module, "sync_model", synced)
    pool: Any = None  # not reached: sync_model is replaced
    outcome = asyncio.run(up_sync_module.sync_for_up(
        spec(), {"": (spec(), pool)}, [], tmp_path / "c.toml"))
    up_sync = outcome[""]
    assert up_sync.ok and up_sync.placement is PIPELINE
    assert found(prints, up_sync.placement) == []
