"""Links between ranks through real local agents: the check before launch and the link watch."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from contract.agent_protocol import LinkState, LinkTarget
from node_agent import links
from orchestrator.config.load import check_cluster_data
from orchestrator.launch.reachability import LinkChecks, link_table
from orchestrator.transports.pool import NodePool
from testkit.ports import free_port, free_port_block

# An address no interface here has: binding it fails at once, and nothing is ever sent.
NOT_OURS = "10.255.255.1"


def cluster(tmp_path: Path, ips: list[str]) -> dict[str, object]:
    nodes = [{"name": f"n{i}", "ip": ip} for i, ip in enumerate(ips)]
    return {
        "cluster": {"rank_port": free_port_block(len(ips)), "state_dir": str(tmp_path)},
        "nodes": nodes,
    }


@pytest.fixture
async def pool_of(tmp_path: Path) -> AsyncIterator[list[NodePool]]:
    pools: list[NodePool] = []
    yield pools
    for pool in pools:
        await pool.close_all()


async def connected(pools: list[NodePool], data: dict[str, object], tmp_path: Path) -> NodePool:
    spec, _ = check_cluster_data(data, tmp_path / "cluster.toml")
    pool = NodePool(spec, on_event=lambda n, e: None, on_lost=lambda n, x: None)
    pools.append(pool)
    assert await pool.connect_all() == []
    return pool


async def test_reachable_ring_passes(pool_of: list[NodePool], tmp_path: Path) -> None:
    """Three ranks on loopback: every hop of the ring is listened on and connected to."""
    pool = await connected(pool_of, cluster(tmp_path, ["127.0.0.1"] * 3), tmp_path)
    checks = LinkChecks(pool.spec, pool)
    assert len(checks.hops) == 3
    assert await checks.check() == []


async def test_address_not_on_the_node_is_named(pool_of: list[NodePool], tmp_path: Path) -> None:
    """A rank address its node does not have fails the check, naming hop, field and reason."""
    pool = await connected(pool_of, cluster(tmp_path, ["127.0.0.1", NOT_OURS]), tmp_path)
    failures = await LinkChecks(pool.spec, pool).check()
    assert [(f.src, f.dst, f.field) for f in failures] == [("n0", "n1", "nodes[1].ip")]
    assert failures[0].address.startswith(f"{NOT_OURS}:")
    assert "cannot listen there" in failures[0].error
    table = link_table(failures)
    assert "n0" in table and NOT_OURS in table and "fix:" in table


async def test_watch_goes_down_after_silent_probes_and_up_at_the_next_answer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One silent probe is ridden out; two in a row report down; the next answer, up."""
    script = iter([None, "silent", None, "silent", "silent", "silent", None, None])
    emitted: list[LinkState] = []

    async def scripted_probe(host: str, port: int, timeout_s: float) -> str | None:
        try:
            return next(script)
        except StopIteration:
            await asyncio.sleep(3600)  # the script is over: wait to be cancelled
            raise

    async def emit(message: object) -> None:
        assert isinstance(message, LinkState)
        emitted.append(message)

    monkeypatch.setattr(links, "probe", scripted_probe)
    probes = links.LinkProbes(emit)
    await probes.watch([LinkTarget(host="10.0.1.2", port=52101)], 0.0, 1.0, 2)
    for _ in range(100):
        if len(emitted) == 2:
            break
        await asyncio.sleep(0.01)
    await probes.close()
    assert [(s.up, s.error) for s in emitted] == [(False, "silent"), (True, "")]


async def test_connect_reports_refusal_and_probe_counts_it_as_up() -> None:
    """Nothing listening: connect fails as refused, which the link watch counts as up."""
    port = free_port()
    result = await links.connect("127.0.0.1", port, 2.0)
    assert not result.ok and "refused" in result.error.lower()
    assert await links.probe("127.0.0.1", port, 2.0) is None


async def test_a_probe_loop_whose_cancellation_was_lost_stops_once_unwatched(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Python 3.11's wait_for can swallow a cancellation that races its own end (a host
    thawed after sleeping): the probe loop must still stop when its watch is replaced,
    or it keeps connecting to a port the next gang's rank accepts its ring peer on."""
    calls = 0

    async def probe_that_swallows_cancel(host: str, port: int, timeout_s: float) -> str | None:
        nonlocal calls
        calls += 1
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.sleep(0.01)
        return None

    async def emit(message: object) -> None:
        pass

    monkeypatch.setattr(links, "probe", probe_that_swallows_cancel)
    probes = links.LinkProbes(emit)
    await probes.watch([LinkTarget(host="10.0.1.2", port=52101)], 0.0, 1.0, 2)
    await asyncio.sleep(0.05)
    await probes.close()
    await asyncio.sleep(0.05)
    stopped_at = calls
    await asyncio.sleep(0.1)
    assert calls == stopped_at, "the probe loop went on after its watch was closed"
