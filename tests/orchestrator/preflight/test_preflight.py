"""Preflight on real fingerprints from a real local agent, each check failing on its own."""

from __future__ import annotations

import asyncio
from pathlib import Path

import msgspec
import pytest

from contract.fingerprint import NetInterface, NodeFingerprint
from contract.placement import Placement
from orchestrator.config import ClusterSpec, NodeSpec
from orchestrator.config.load import check_cluster_data
from orchestrator.placement.decide import place
from orchestrator.preflight.checks import run_preflight
from orchestrator.preflight.failure import PreflightFailure
from orchestrator.transports import LocalTransport

replace = msgspec.structs.replace


def cluster(model: str, node_count: int = 1, **sections: dict[str, object]) -> ClusterSpec:
    data: dict[str, object] = {
        "model": {"path": model},
        "nodes": [{"name": f"n{i}", "ip": "127.0.0.1"} for i in range(node_count)],
        **sections,
    }
    spec, _warnings = check_cluster_data(data, Path("test.toml"))
    return spec


async def take_fingerprint(model: str) -> NodeFingerprint:
    async with LocalTransport(NodeSpec(name="local")) as transport:
        agent = await transport.start_agent()
        return await agent.fingerprint(model)


@pytest.fixture(scope="module")
def bundled_fingerprint() -> NodeFingerprint:
    """One real fingerprint of this machine, taken by a real local agent."""
    return asyncio.run(take_fingerprint("bundled:smollm2-135m-instruct"))


def prints_for(spec: ClusterSpec, fingerprint: NodeFingerprint) -> dict[str, NodeFingerprint]:
    return {node.name: fingerprint for node in spec.nodes}


def checks(failures: list[PreflightFailure]) -> list[str]:
    return [failure.check for failure in failures]


async def test_healthy_local_cluster_passes(bundled_fingerprint: NodeFingerprint) -> None:
    """This machine passes preflight for 1 and 3 ranks of the bundled model."""
    for ranks in (1, 3):
        spec = cluster("bundled:smollm2-135m-instruct", ranks)
        assert run_preflight(spec, prints_for(spec, bundled_fingerprint)) == []


async def test_heads_not_divisible_names_working_rank_counts(
    bundled_fingerprint: NodeFingerprint,
) -> None:
    """SmolLM2 (9 heads, 3 KV heads) on 2 ranks: auto pipelines it; tensor is refused,
    suggesting pipeline, 1 or 3 ranks."""
    spec = cluster("bundled:smollm2-135m-instruct", 2)
    assert run_preflight(spec, prints_for(spec, bundled_fingerprint)) == []
    spec = cluster("bundled:smollm2-135m-instruct", 2, cluster={"parallel": "tensor"})
    (failure,) = run_preflight(spec, prints_for(spec, bundled_fingerprint))
    assert failure.check == "heads"
    assert "9 attention heads and 3 KV heads" in failure.found
    assert '"pipeline"' in failure.fix and "use 1 or 3 nodes" in failure.fix


async def test_memory_gb_above_the_node_is_refused(bundled_fingerprint: NodeFingerprint) -> None:
    """A memory_gb the node does not have names the field and the node's memory."""
    assert bundled_fingerprint.memory is not None
    too_much = bundled_fingerprint.memory.total_bytes / 1024**3 + 1
    data = {"model": {"path": "bundled:smollm2-135m-instruct"},
            "nodes": [{"name": "n0", "ip": "127.0.0.1", "memory_gb": too_much}]}
    spec, _warnings = check_cluster_data(data, Path("test.toml"))
    (failure,) = run_preflight(spec, prints_for(spec, bundled_fingerprint))
    assert failure.check == "memory" and "nodes[0].memory_gb" in failure.found
    assert "set nodes[0].memory_gb to at most" in failure.fix


async def test_missing_model(bundled_fingerprint: NodeFingerprint, tmp_path: Path) -> None:
    """A model path that does not exist on a node is named with that node."""
    missing = await take_fingerprint(str(tmp_path / "no-such-model"))
    spec = cluster(str(tmp_path / "no-such-model"))
    failures = run_preflight(spec, prints_for(spec, missing))
    assert checks(failures) == ["model"]
    assert failures[0].node == "n0" and "does not exist" in failures[0].found


async def test_model_differs_between_nodes(bundled_fingerprint: NodeFingerprint) -> None:
    """Two nodes with different model digests fail with both digests named."""
    spec = cluster("bundled:smollm2-135m-instruct", 3)
    assert bundled_fingerprint.model is not None
    other = replace(bundled_fingerprint, model=replace(bundled_fingerprint.model, digest="0" * 16))
    prints = {"n0": bundled_fingerprint, "n1": bundled_fingerprint, "n2": other}
    (failure,) = run_preflight(spec, prints)
    assert failure.check == "model" and "0" * 16 in failure.found and "n2" in failure.found


async def test_version_mismatch_is_a_per_field_diff(bundled_fingerprint: NodeFingerprint) -> None:
    """A node with another mlx-lm is named with both versions."""
    spec = cluster("bundled:smollm2-135m-instruct", 3)
    packages = dict(bundled_fingerprint.packages, **{"mlx-lm": "0.0.1"})
    prints = prints_for(spec, bundled_fingerprint) | {
        "n1": replace(bundled_fingerprint, packages=packages)
    }
    (failure,) = run_preflight(spec, prints)
    assert failure.check == "versions" and failure.node == "n1"
    assert (
        f"mlx-lm 0.0.1 differs from {bundled_fingerprint.packages['mlx-lm']} on n0" == failure.found
    )
    assert "orchestrator bootstrap cluster.toml" in failure.fix


async def test_mlx_not_installed(bundled_fingerprint: NodeFingerprint) -> None:
    """A node whose python lacks mlx is told to install it."""
    spec = cluster("bundled:smollm2-135m-instruct")
    packages = dict(bundled_fingerprint.packages, mlx=None)
    failures = run_preflight(spec, {"n0": replace(bundled_fingerprint, packages=packages)})
    assert checks(failures) == ["versions"]
    assert "mlx is not installed" in failures[0].found
    assert "orchestrator bootstrap cluster.toml" in failures[0].fix


async def test_memory_too_small(bundled_fingerprint: NodeFingerprint) -> None:
    """Reserving more memory than the node has leaves no room for the model."""
    spec = cluster("bundled:smollm2-135m-instruct", preflight={"reserve_memory_gb": 1e6})
    failures = run_preflight(spec, prints_for(spec, bundled_fingerprint))
    assert checks(failures) == ["memory"]
    assert "may use" in failures[0].found


async def test_ranks_on_one_machine_share_its_memory(
    bundled_fingerprint: NodeFingerprint,
) -> None:
    """Three ranks whose nodes report one kernel (namespaces of one machine) need their
    shares together: room for two shares fails them, naming the sum; three machines pass."""
    spec = cluster("bundled:smollm2-135m-instruct", 3)
    prints = prints_for(spec, bundled_fingerprint)
    placement = place(spec, prints)
    assert isinstance(placement, Placement) and bundled_fingerprint.memory
    need = placement.ranks[0].weight_bytes + placement.ranks[0].kv_bytes
    usable = bundled_fingerprint.memory.available_bytes or bundled_fingerprint.memory.total_bytes
    reserve_gb = (usable - 2 * need) / 1024**3  # room for two ranks' shares
    spec = cluster("bundled:smollm2-135m-instruct", 3, preflight={"reserve_memory_gb": reserve_gb})
    failures = run_preflight(spec, prints)
    assert checks(failures) == ["memory"]
    assert failures[0].found.count("3 ranks share this machine") == 3
    assert "separate machines" in failures[0].fix
    apart = {
        node.name: replace(bundled_fingerprint, boot_id=f"machine-{i}")
        for i, node in enumerate(spec.nodes)
    }
    assert run_preflight(spec, apart) == []


async def test_ip_not_owned(bundled_fingerprint: NodeFingerprint) -> None:
    """A node configured with an address it does not have fails with its real addresses."""
    data_spec = cluster("bundled:smollm2-135m-instruct")
    spec = replace(data_spec, nodes=[replace(data_spec.nodes[0], ip="192.0.2.77")])
    failures = run_preflight(spec, prints_for(spec, bundled_fingerprint))
    assert checks(failures) == ["address"]
    assert "does not own 192.0.2.77" in failures[0].found and "127.0.0.1" in failures[0].found


async def test_link_address_not_owned_names_its_field(
    bundled_fingerprint: NodeFingerprint,
) -> None:
    """With [[links]], each node must own its address on each cable; the field is named."""
    # This machine's fingerprint with one cable's address added (a machine without a
    # second IPv4 address would otherwise leave the check untested): every "node" is this
    # machine, so both addresses are owned by all.
    mine, other = "127.0.0.1", "198.51.100.7"
    cable = NetInterface(name="cable0", addresses=[other], is_up=True)
    bundled_fingerprint = msgspec.structs.replace(
        bundled_fingerprint, interfaces=[*bundled_fingerprint.interfaces, cable]
    )
    links = [
        {"between": ["n0", "n1"], "ips": [mine, other]},
        {"between": ["n1", "n2"], "ips": [mine, "192.0.2.9"]},
        {"between": ["n2", "n0"], "ips": [mine, other]},
    ]
    spec = cluster("bundled:smollm2-135m-instruct", 3, links=links)  # type: ignore[arg-type]
    failures = run_preflight(spec, prints_for(spec, bundled_fingerprint))
    address = [f for f in failures if f.check == "address"]
    assert [(f.node, "links[1].ips[1]" in f.found) for f in address] == [("n2", True)]
    assert "does not own 192.0.2.9" in address[0].found


async def test_jaccl_refused_on_linux(bundled_fingerprint: NodeFingerprint) -> None:
    """jaccl on a Linux node is refused with the reason."""
    data = {
        "cluster": {"backend": "jaccl"},
        "model": {"path": "bundled:smollm2-135m-instruct"},
        "nodes": [{"name": "n0", "ip": "127.0.0.1", "rdma": [""]}],
    }
    spec, _ = check_cluster_data(data, Path("t.toml"))
    failures = run_preflight(spec, prints_for(spec, bundled_fingerprint))
    assert checks(failures) == ["jaccl"] and "macOS only" in failures[0].found
