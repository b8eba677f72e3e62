"""How init reads hosts' addresses: cables, ring order, the shared subnet (pure logic, on
hand-made probes of Linux hosts)."""

from __future__ import annotations

import ipaddress

import pytest

from node_agent.probes.addresses import InterfaceAddresses
from orchestrator.init.cables import find_cables
from orchestrator.init.layout import InitError, plan_layout, ring_order
from orchestrator.init.probe import HostProbe


def host(target: str, **interfaces: str) -> HostProbe:
    """A Linux host with interfaces given as name="addr/prefix[,addr/prefix]"."""
    return HostProbe(target, system="Linux", interfaces=[
        InterfaceAddresses(name, [ipaddress.IPv4Interface(a) for a in addrs.split(",")], up=True)
        for name, addrs in interfaces.items()
    ])


def ring_of(size: int) -> list[HostProbe]:
    """Hosts h0..h(n-1), cable k a /30 between h(k) and h(k+1), SSH on a shared /24."""
    hosts = [host(f"10.9.0.{i + 1}", mgmt=f"10.9.0.{i + 1}/24") for i in range(size)]
    for k in range(size):
        a, b = hosts[k], hosts[(k + 1) % size]
        for end, side in ((a, 1), (b, 2)):
            end.interfaces.append(InterfaceAddresses(
                f"c{k}", [ipaddress.IPv4Interface(f"10.20.{k}.{side}/30")], up=True))
    return hosts


def test_point_to_point_subnets_are_cables_and_a_shared_one_is_not() -> None:
    """Each /30 with one other host is a cable; the /24 all hosts share is not."""
    cables = find_cables(ring_of(3))
    assert sorted(sorted(c.hosts) for c in cables) == [[0, 1], [0, 2], [1, 2]]
    assert all(c.kind == "point-to-point" and c.addressed for c in cables)


def test_ring_order_needs_every_cable_of_the_ring() -> None:
    """Cables 0-1, 1-2, 2-3, 3-0 make the ring 0 1 2 3; without 1-2 there is none."""
    cables = find_cables(ring_of(4))
    assert ring_order(4, cables) == [0, 1, 2, 3]
    assert ring_order(4, [c for c in cables if c.hosts != frozenset((1, 2))]) is None


def test_a_ring_of_four_is_written_in_cable_order() -> None:
    """Hosts given 0, 2, 1, 3 of a ring 0-1-2-3: the nodes come out in ring order, rank 0
    first as given."""
    hosts = ring_of(4)
    given = [hosts[0], hosts[2], hosts[1], hosts[3]]
    layout = plan_layout(given, ["a", "c", "b", "d"])
    assert [["a", "c", "b", "d"][i] for i in layout.order] == ["a", "b", "c", "d"]
    assert layout.backend == "ring" and len(layout.links) == 4


def test_a_switch_uses_the_subnet_ssh_does_not_go_through() -> None:
    """Two shared subnets: the one without the SSH addresses carries the ranks."""
    hosts = [host(f"root@10.9.0.{i}", mgmt=f"10.9.0.{i}/24", data=f"10.8.0.{i}/24")
             for i in (1, 2, 3)]
    layout = plan_layout(hosts, ["a", "b", "c"])
    assert layout.links == [] and layout.node_ips == {0: "10.8.0.1", 1: "10.8.0.2",
                                                      2: "10.8.0.3"}


def test_hosts_with_nothing_in_common_are_refused_with_the_fix() -> None:
    """No shared subnet and no ring: InitError says to cable a ring or join a network."""
    hosts = [host("a", eth0="10.1.0.1/24"), host("b", eth0="10.2.0.1/24")]
    with pytest.raises(InitError, match="cable them in a ring"):
        plan_layout(hosts, ["a", "b"])


def test_uneven_cables_use_as_many_per_pair_as_the_least_cabled_pair() -> None:
    """A second cable between h0 and h1 only: one link per neighbour pair, the extra left."""
    hosts = ring_of(3)
    for end, side in ((hosts[0], 1), (hosts[1], 2)):
        end.interfaces.append(InterfaceAddresses(
            "x", [ipaddress.IPv4Interface(f"10.30.0.{side - 1}/31")], up=True))
    layout = plan_layout(hosts, ["a", "b", "c"])
    assert len(layout.cables) == 4 and len(layout.links) == 3


def test_three_hosts_in_a_line_are_no_ring() -> None:
    """Cables 0-1 and 1-2 but none 2-0: no ring order."""
    cables = [c for c in find_cables(ring_of(3)) if c.hosts != frozenset((0, 2))]
    assert ring_order(3, cables) is None


def test_two_hosts_on_a_shared_24_are_a_switch_not_a_cable() -> None:
    """A /24 with just the other host in it is a network, not a cable: nodes get ips."""
    hosts = [host(f"root@10.9.0.{i}", mgmt=f"10.9.0.{i}/24", data=f"10.8.0.{i}/24")
             for i in (1, 2)]
    layout = plan_layout(hosts, ["a", "b"])
    assert layout.cables == [] and layout.node_ips == {0: "10.8.0.1", 1: "10.8.0.2"}
