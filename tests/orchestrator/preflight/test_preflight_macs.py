"""Mac-only preflight: each Thunderbolt interface a JACCL cable uses has an IPv4 address.

The Mac side is built from recorded tool outputs (tests/fixtures/node_tools: `rdma_ctl
status`, `ibv_devinfo -v` of a Mac Studio with rdma_en3 and rdma_en4 active) on top of this
machine's real fingerprint; interfaces are as psutil lists them on a Mac (a port with only
its IPv6 link-local address until one is given)."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from contract.fingerprint import NetInterface, NodeFingerprint, OsInfo, RdmaInfo
from node_agent.fingerprint import collect_fingerprint
from node_agent.probes import rdma
from orchestrator.config import ClusterSpec
from orchestrator.config.load import check_cluster_data
from orchestrator.preflight.checks import run_preflight
from testkit import paths

FIXTURES = paths.FIXTURES / "node_tools"


def ring_of_three() -> ClusterSpec:
    """Three Macs, a jaccl ring: each uses rdma_en3 towards its right and rdma_en4 left."""
    names = ["s1", "s2", "s3"]
    data: dict[str, object] = {
        "cluster": {"backend": "jaccl"},
        "model": {"path": "bundled:smollm2-135m-instruct"},
        "nodes": [{"name": n, "ip": "127.0.0.1"} for n in names],
        "links": [
            {"between": [names[i], names[(i + 1) % 3]], "rdma": ["rdma_en3", "rdma_en4"]}
            for i in range(3)
        ],
    }
    spec, _warnings = check_cluster_data(data, Path("test.toml"))
    return spec


def mac(base: NodeFingerprint, interfaces: list[NetInterface]) -> NodeFingerprint:
    status = rdma.parse_rdma_ctl_status((FIXTURES / "rdma_ctl_status_enabled.txt").read_text())
    devices = rdma.parse_ibv_devinfo((FIXTURES / "ibv_devinfo_v_active.txt").read_text())
    return msgspec.structs.replace(
        base,
        os=OsInfo(system="Darwin", name="macOS", version="26.2", kernel="25.2.0"),
        rdma=RdmaInfo(status=status, devices=devices, device_names=[d.name for d in devices]),
        interfaces=[*base.interfaces, *interfaces],
        unavailable={},
    )


@pytest.fixture(scope="module")
def here() -> NodeFingerprint:
    return collect_fingerprint("bundled:smollm2-135m-instruct", None)


def jaccl_failures(spec: ClusterSpec, prints: dict[str, NodeFingerprint]) -> list[str]:
    return [f.render() for f in run_preflight(spec, prints) if f.check == "jaccl"]


def test_every_cable_interface_with_ipv4_passes(here: NodeFingerprint) -> None:
    """Both ports of every Mac have an IPv4 address: no jaccl failure."""
    ports = [
        NetInterface(name="en3", addresses=["10.10.1.1", "fe80::1"], is_up=True),
        NetInterface(name="en4", addresses=["10.10.3.2", "fe80::2"], is_up=True),
    ]
    spec = ring_of_three()
    assert jaccl_failures(spec, {n.name: mac(here, ports) for n in spec.nodes}) == []


def test_a_port_without_ipv4_is_named_with_its_cable_and_the_fix(here: NodeFingerprint) -> None:
    """s2's en4 has only its link-local IPv6: preflight names node, interface, device, peer,
    the field and MLX's error, and how to give it an address."""
    good = [
        NetInterface(name="en3", addresses=["10.10.1.1"], is_up=True),
        NetInterface(name="en4", addresses=["10.10.3.2"], is_up=True),
    ]
    bare = [good[0], NetInterface(name="en4", addresses=["fe80::1c2a:3bff:fe4d:5e6f"])]
    spec = ring_of_three()
    prints = {"s1": mac(here, good), "s2": mac(here, bare), "s3": mac(here, good)}
    (failure,) = jaccl_failures(spec, prints)
    assert failure.startswith("[jaccl] s2: en4 (RDMA device rdma_en4 towards s1, links[0].rdma[1])")
    assert "No IPv4-mapped GID" in failure
    assert "sudo ifconfig en4 inet" in failure and "docs/mac-setup.md" in failure


def test_a_port_missing_from_the_listing_has_no_address(here: NodeFingerprint) -> None:
    """An interface psutil does not list (no address at all) fails the same way."""
    spec = ring_of_three()
    prints = {n.name: mac(here, []) for n in spec.nodes}
    failures = jaccl_failures(spec, prints)
    assert len(failures) == 6 and all("(no address)" in f for f in failures)


def test_without_psutil_interfaces_are_not_judged(here: NodeFingerprint) -> None:
    """No psutil on the node: addresses are unknown, so nothing is claimed about them."""
    spec = ring_of_three()
    blind = msgspec.structs.replace(mac(here, []), unavailable={"psutil": "not installed"})
    assert jaccl_failures(spec, {n.name: blind for n in spec.nodes}) == []
