"""Instances sharing a node (or a machine): their weights and KV summed at preflight."""

from __future__ import annotations

import asyncio
from pathlib import Path

import msgspec
import pytest

from contract.fingerprint import NodeFingerprint
from contract.placement import Placement
from orchestrator.config import ClusterSpec, NodeSpec
from orchestrator.config.instances import instance_specs
from orchestrator.config.load import check_cluster_data
from orchestrator.placement.decide import place
from orchestrator.preflight.shared_nodes import shared_memory_failures
from orchestrator.transports import LocalTransport

MODEL = "bundled:smollm2-135m-instruct"


@pytest.fixture(scope="module")
def fingerprint() -> NodeFingerprint:
    """A real fingerprint of this machine, taken by a real local agent."""
    async def take() -> NodeFingerprint:
        async with LocalTransport(NodeSpec(name="local")) as transport:
            return await (await transport.start_agent()).fingerprint(MODEL)
    return asyncio.run(take())


def _two_on_a(reserve_gb: float) -> ClusterSpec:
    data = {
        "preflight": {"reserve_memory_gb": reserve_gb},
        "nodes": [{"name": "a", "ip": "127.0.0.1"}, {"name": "b", "ip": "127.0.0.1"}],
        "instances": [
            {"name": "big", "model": MODEL, "id": "big", "nodes": ["a"]},
            {"name": "fast", "model": MODEL, "id": "fast", "nodes": ["a"]},
            {"name": "other", "model": MODEL, "id": "other", "nodes": ["b"]},
        ],
    }
    return check_cluster_data(data, Path("test.toml"))[0]


def _failures(spec: ClusterSpec, prints: dict[str, NodeFingerprint]) -> list[str]:
    placed = {}
    for name, derived in instance_specs(spec).items():
        placement = place(derived, {n.name: prints[n.name] for n in derived.nodes})
        assert isinstance(placement, Placement)
        placed[name] = (derived, placement)
    return [f.render() for f in shared_memory_failures(spec, placed, prints)]


def test_two_instances_on_one_node_are_summed(fingerprint: NodeFingerprint) -> None:
    """Room for one instance's share on node a but not two: refused naming both and the
    sum; node b's lone instance is not counted with them; with room, it passes."""
    apart = {"a": msgspec.structs.replace(fingerprint, boot_id="machine-a"),
             "b": msgspec.structs.replace(fingerprint, boot_id="machine-b")}
    one = place(instance_specs(_two_on_a(0))["big"], apart)
    assert isinstance(one, Placement) and fingerprint.memory
    need = one.ranks[0].weight_bytes + one.ranks[0].kv_bytes
    usable = fingerprint.memory.available_bytes or fingerprint.memory.total_bytes
    tight = _two_on_a((usable - 1.5 * need) / 1024**3)  # room for one and a half
    failures = _failures(tight, apart)
    assert len(failures) == 1 and "[memory] a:" in failures[0]
    assert "big " in failures[0] and "fast " in failures[0] and "+ other " not in failures[0]
    assert _failures(_two_on_a((usable - 2.5 * need) / 1024**3), apart) == []


def test_nodes_of_one_machine_count_together(fingerprint: NodeFingerprint) -> None:
    """Namespace hosts of one kernel: instances on different nodes still share memory."""
    prints = {"a": fingerprint, "b": fingerprint}  # one boot id: one machine
    one = place(instance_specs(_two_on_a(0))["big"], prints)
    assert isinstance(one, Placement) and fingerprint.memory
    need = one.ranks[0].weight_bytes + one.ranks[0].kv_bytes
    usable = fingerprint.memory.available_bytes or fingerprint.memory.total_bytes
    failures = _failures(_two_on_a((usable - 2.5 * need) / 1024**3), prints)
    assert len(failures) == 1 and "a, b" in failures[0] and "+ other " in failures[0]
