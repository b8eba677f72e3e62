"""RDMA device names read again before every JACCL launch: a node's real agent, and a
Mac's recorded `ibv_devices` whose names changed after a reboot."""

from __future__ import annotations

from pathlib import Path

import msgspec

from contract.fingerprint import NodeFingerprint, OsInfo, RdmaInfo
from node_agent.probes.rdma import parse_ibv_devices, parse_rdma_ctl_status
from orchestrator.config.load import check_cluster_data
from orchestrator.supervision.failures import Cause
from orchestrator.supervision.rdma_devices import rdma_device_problems
from orchestrator.transports.pool import NodePool
from testkit import paths

TOOLS = paths.FIXTURES / "node_tools"


def jaccl_pool(
    tmp_path: Path, backend: str = "jaccl", rdma: list[list[str]] | None = None
) -> NodePool:
    devices = rdma or [[""]]
    data = {
        "cluster": {"backend": backend, "state_dir": str(tmp_path)},
        "nodes": [{"name": f"n{i}", "ip": "127.0.0.1", "rdma": row}
                  for i, row in enumerate(devices)],
    }
    spec, _ = check_cluster_data(data, tmp_path / "cluster.toml")
    return NodePool(spec, on_event=lambda n, e: None, on_lost=lambda n, x: None)


class RecordedAgent:
    """An agent whose fingerprint is a Mac's, its RDMA from recorded tool output."""

    closed = False

    def __init__(self, fingerprint: NodeFingerprint) -> None:
        self.fingerprint_now = fingerprint
        self.asked: list[str | None] = []

    async def fingerprint(self, model: str | None, timeout: float) -> NodeFingerprint:
        self.asked.append(model)
        return self.fingerprint_now


async def test_a_fresh_fingerprint_is_checked_before_a_jaccl_launch(tmp_path: Path) -> None:
    """The node's real agent answers a fresh fingerprint; on Linux preflight's JACCL check
    refuses it: a spawn_failed failure (no restart can help), with the fix."""
    pool = jaccl_pool(tmp_path)
    await pool.connect("n0")
    try:
        failures = await rdma_device_problems(pool.spec, pool, now=5.0)
    finally:
        await pool.close_all()
    assert [(f.cause, f.node, f.at) for f in failures] == [(Cause.SPAWN_FAILED, "n0", 5.0)]
    assert "macOS only, read again before this launch" in failures[0].detail


async def test_a_device_renamed_after_a_reboot_is_named_with_what_the_node_has(
    tmp_path: Path,
) -> None:
    """cluster.toml says rdma_en5; after a reboot the Mac has rdma_en2..4 (recorded
    `ibv_devices`): failed at once naming them; the model is not hashed again."""
    pool = jaccl_pool(tmp_path, rdma=[["", "rdma_en5"], ["rdma_en2", ""]])
    await pool.connect("n0")
    try:
        linux = await pool.agent("n0").fingerprint(None)
    finally:
        await pool.close_all()
    mac = msgspec.structs.replace(
        linux,
        os=OsInfo(system="Darwin", name="macOS", version="26.2", kernel="25.2.0"),
        rdma=RdmaInfo(
            status=parse_rdma_ctl_status((TOOLS / "rdma_ctl_status_enabled.txt").read_text()),
            device_names=parse_ibv_devices((TOOLS / "ibv_devices_m4pro_mini.txt").read_text()),
        ),
    )
    agents = {name: RecordedAgent(mac) for name in pool.nodes}  # both Macs the same
    for name, agent in agents.items():
        pool.nodes[name].agent = agent  # type: ignore[assignment]
    failures = await rdma_device_problems(pool.spec, pool, now=1.0)
    assert [agent.asked for agent in agents.values()] == [[None], [None]]
    # (The recorded Mac has no en5 interface either: its IPv4 check fails beside it.)
    assert failures and {f.cause for f in failures} == {Cause.SPAWN_FAILED}
    detail = failures[0].detail
    assert "rdma_en5 not found (present: rdma_en2, rdma_en3, rdma_en4)" in detail
    assert "device names can change after a reboot" in detail


async def test_ring_clusters_are_not_asked(tmp_path: Path) -> None:
    """Only JACCL uses RDMA devices: a ring cluster's launch asks nothing."""
    pool = jaccl_pool(tmp_path, backend="ring")
    assert await rdma_device_problems(pool.spec, pool, now=0.0) == []
