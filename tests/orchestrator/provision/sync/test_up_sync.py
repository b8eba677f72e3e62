"""`up` with `[model] sync = true` and `[[instances]]`: each (model, node) synced once for
every instance launched afresh, each instance told its own outcome and pipeline split."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from contract.placement import Placement
from orchestrator.config import ClusterSpec, check_cluster_file
from orchestrator.config.instances import instance_specs
from orchestrator.provision.sync import up_sync
from orchestrator.provision.sync.model_sync import NodeOutcome, SyncReport
from orchestrator.provision.sync.up_sync import UpSync, sync_for_up
from orchestrator.transports.pool import NodePool
from testkit.config_files import write

NODES = "".join(f'[[nodes]]\nname = "{n}"\nip = "127.0.0.1"\n' for n in "abc")
INSTANCES = NODES + """
[model]
path = "/models/big"
sync = true
[[instances]]
name = "main"
model = "/models/big"
nodes = ["a", "b"]
[[instances]]
name = "fast"
model = "/models/small"
nodes = ["b"]
[[instances]]
name = "main-2"
model = "/models/big"
id = "big"
nodes = ["b", "c"]
"""


def split(name: str) -> Placement:
    return Placement(mode="pipeline", reason=name, layer_count=4, ranks=[])


class Syncs:
    """sync_model as `up` calls it: each call's model and nodes; c fails."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, list[str], list[list[str]]]] = []

    async def __call__(self, spec: ClusterSpec, pool: NodePool, progress: object,
                       source: str | None, rerun: str, parts: list[ClusterSpec]) -> SyncReport:
        nodes = [node.name for node in spec.nodes]
        self.calls.append((spec.model.path, nodes, [[n.name for n in p.nodes] for p in parts]))
        return SyncReport(
            path=spec.model.path, source="this machine",
            nodes=[NodeOutcome(n, "failed" if n == "c" else "synced") for n in nodes],
            placements=[split(p.cluster.name) for p in parts])


def run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        only: set[str] | None = None) -> tuple[Syncs, dict[str, UpSync]]:
    spec, _ = check_cluster_file(write(tmp_path, INSTANCES))
    syncs = Syncs()
    monkeypatch.setattr(up_sync, "sync_model", syncs)
    pool = NodePool(spec, on_event=lambda node, event: None, on_lost=lambda node, info: None)
    fresh = {name: (one, pool) for name, one in instance_specs(spec).items()
             if only is None or name in only}
    return syncs, asyncio.run(sync_for_up(spec, fresh, [pool], tmp_path / "cluster.toml"))


def test_a_node_shared_by_two_instances_of_one_model_is_synced_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """main and main-2 both run big on b: one sync of big over a, b, c (b once), one of small."""
    syncs, _ = run(tmp_path, monkeypatch)
    assert syncs.calls == [("/models/big", ["a", "b", "c"], [["a", "b"], ["b", "c"]]),
                           ("/models/small", ["b"], [["b"]])]
    pairs = [(model, node) for model, nodes, _ in syncs.calls for node in nodes]
    assert len(pairs) == len(set(pairs))


def test_each_instance_gets_its_own_outcome_and_split(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """c failed: main-2 (on c) does not launch, main (same model, a and b) does, each with
    the split its own shards were chosen for."""
    _, outcome = run(tmp_path, monkeypatch)
    assert {name: up.ok for name, up in outcome.items()} == {
        "main": True, "main-2": False, "fast": True}
    assert outcome["main"].placement == split("mlx-cluster-main")
    assert outcome["main-2"].placement == split("mlx-cluster-main-2")


def test_an_adopted_instance_is_left_out(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """main-2 adopted (serving on): big goes to main's nodes only, c is not touched."""
    syncs, outcome = run(tmp_path, monkeypatch, only={"main", "fast"})
    assert [(model, nodes) for model, nodes, _ in syncs.calls] == [
        ("/models/big", ["a", "b"]), ("/models/small", ["b"])]
    assert set(outcome) == {"main", "fast"}
