"""From probed hosts and their cables to what cluster.toml says: the order of the nodes
(rank order), the backend and why, each cable's addresses and RDMA devices, the nodes'
`ip`, and the commands that would prepare what is missing.

    cables close a ring ──▶ [[links]] in ring order (2 hosts: one cable is the ring)
        every Mac RDMA-enabled, macOS 26.2+, each cable end's rdma_<if> present ──▶ jaccl
        otherwise ──▶ ring over the cables' addresses (proposed /30s where missing)
    no ring of cables ──▶ ring backend over the subnet every host shares (a switch)
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterator
from dataclasses import dataclass, field

from orchestrator.init import addressing
from orchestrator.init.cables import Cable, find_cables
from orchestrator.init.probe import HostProbe

JACCL_MIN_MACOS = (26, 2)  # Apple TN3205: RDMA over Thunderbolt


class InitError(Exception):
    """The hosts cannot make a cluster as probed; the message says what to change."""


@dataclass
class LinkPlan:
    cable: Cable
    between: tuple[int, int]  # host indices, in the order the link names them
    ips: tuple[str, str]
    rdma: tuple[str, str] | None = None
    proposed: bool = False  # the addresses are init's proposal, not on the hosts yet


@dataclass
class Layout:
    order: list[int]  # host indices in rank order
    backend: str = "ring"
    reasons: list[str] = field(default_factory=list)  # why this backend, for the comment
    links: list[LinkPlan] = field(default_factory=list)
    node_ips: dict[int, str] = field(default_factory=dict)
    cables: list[Cable] = field(default_factory=list)  # every cable found
    commands: dict[int, list[str]] = field(default_factory=dict)  # host -> to run there


def plan_layout(hosts: list[HostProbe], names: list[str]) -> Layout:
    cables = find_cables(hosts)
    if len(hosts) == 1:
        return Layout([0], reasons=["one node: no links between ranks"], cables=cables)
    order = ring_order(len(hosts), cables)
    if order is None:
        layout = _switch_layout(hosts, cables)
    else:
        layout = Layout(order, cables=cables)
        _ring_links(layout, hosts, names)
        _choose_backend(layout, hosts)
    return layout


def ring_order(size: int, cables: list[Cable]) -> list[int] | None:
    """A cycle through every host over the cables, starting at host 0 and keeping the given
    order where it can (depth first, lowest index first); two hosts need one cable."""
    pairs = {cable.hosts for cable in cables}
    if size == 2:
        return [0, 1] if frozenset((0, 1)) in pairs else None

    def extend(path: list[int]) -> list[int] | None:
        if len(path) == size:
            return path if frozenset((path[-1], 0)) in pairs else None
        for nxt in range(size):
            if nxt not in path and frozenset((path[-1], nxt)) in pairs:
                found = extend([*path, nxt])
                if found:
                    return found
        return None

    return extend([0])


def _ring_links(layout: Layout, hosts: list[HostProbe], names: list[str]) -> None:
    """One link per cable between ring neighbours, as many per pair as the least cabled
    pair has (MLX's ring needs as many connections to the left as to the right)."""
    order, size = layout.order, len(layout.order)
    pairs = [(order[k], order[(k + 1) % size]) for k in range(size if size > 2 else 1)]
    per_pair = [
        sorted((c for c in layout.cables if c.hosts == frozenset(p)),
               key=lambda c: c.end(p[0]).interface or "")
        for p in pairs
    ]
    count = min(len(cables) for cables in per_pair)
    subnets = addressing.proposed_subnets(hosts)
    for (a, b), cables in zip(pairs, per_pair, strict=True):
        for cable in cables[:count]:
            layout.links.append(_link(layout, hosts, names, (a, b), cable, subnets))


def _link(layout: Layout, hosts: list[HostProbe], names: list[str], pair: tuple[int, int],
          cable: Cable, subnets: Iterator[ipaddress.IPv4Network]) -> LinkPlan:
    ends = cable.end(pair[0]), cable.end(pair[1])
    if cable.addressed:
        ips = (str(ends[0].address.ip), str(ends[1].address.ip))  # type: ignore[union-attr]
        return LinkPlan(cable, pair, ips)
    subnet = next(subnets)
    mine = [ipaddress.IPv4Interface(f"{subnet.network_address + k}/30") for k in (1, 2)]
    for end, address, peer in zip(ends, mine, reversed(pair), strict=True):
        commands = addressing.setup_commands(hosts[end.host], end, address, names[peer])
        layout.commands.setdefault(end.host, []).extend(commands)
    return LinkPlan(cable, pair, (str(mine[0].ip), str(mine[1].ip)), proposed=True)


def _choose_backend(layout: Layout, hosts: list[HostProbe]) -> None:
    used = {(end.host, end.interface) for link in layout.links for end in link.cable.ends}
    for index, host in enumerate(hosts):
        cabled = {iface for h, iface in used if h == index and iface}
        bridge = addressing.bridge_commands(host, cabled)
        if bridge:
            layout.commands.setdefault(index, [])[:0] = bridge
    kinds = {link.cable.kind for link in layout.links}
    cabling = f"{len(layout.links)} cable(s) close a ring in this node order"
    missing = list(_jaccl_missing(layout, hosts)) if kinds == {"thunderbolt"} else [
        "the cables are not Thunderbolt between Macs (RDMA over Thunderbolt is macOS only)"
    ]
    if missing:
        layout.reasons = [f"ring: {cabling}; jaccl (RDMA) is not possible because", *missing]
        return
    layout.backend = "jaccl"
    layout.reasons = [
        f"jaccl: {cabling}, every Mac has RDMA enabled on macOS 26.2+ and an RDMA device "
        "on each cable end (JACCL's latency is far below the TCP ring's)",
    ]
    for link in layout.links:
        a, b = (link.cable.end(h).interface for h in link.between)
        link.rdma = (f"rdma_{a}", f"rdma_{b}")
    for index, host in enumerate(hosts):
        address = addressing.lan_address(host, {i for h, i in used if h == index and i})
        if address is None:
            raise InitError(f"{host.target}: no LAN address found for JACCL's coordinator "
                            "(en0 or en1); connect it to the LAN or give it an address")
        layout.node_ips[index] = address


def _jaccl_missing(layout: Layout, hosts: list[HostProbe]) -> Iterator[str]:
    for link in layout.links:
        if link.cable.thunderbolt5 is False:
            a, b = (hosts[end.host].target for end in link.cable.ends)
            yield f"  the cable {a} - {b} is {link.cable.speed}: RDMA needs Thunderbolt 5"
    for index, host in enumerate(hosts):
        if _version(host.os_version) < JACCL_MIN_MACOS:
            yield f"  {host.target}: macOS {host.os_version}; RDMA needs 26.2 or later"
            continue
        if host.rdma_status != "enabled":
            yield (f"  {host.target}: rdma_ctl status is {host.rdma_status} (enable it in "
                   "macOS Recovery: docs/mac-setup.md section 2)")
            continue
        for link in layout.links:
            end = link.cable.end(index) if index in link.cable.hosts else None
            if end and f"rdma_{end.interface}" not in host.rdma_devices:
                yield f"  {host.target}: no device rdma_{end.interface} in ibv_devices"


def _version(text: str) -> tuple[int, ...]:
    parts = [int(p) for p in text.split(".")[:2] if p.isdigit()]
    return tuple(parts) or (0,)


def _switch_layout(hosts: list[HostProbe], cables: list[Cable]) -> Layout:
    subnet = addressing.shared_subnet(hosts)
    if subnet is None:
        raise InitError(
            "the hosts share no subnet and their cables close no ring: cable them in a ring "
            "(host 1 to 2, ..., the last to the first) or join them to one network"
        )
    layout = Layout(list(range(len(hosts))), cables=cables)
    why = "no ring of cables" + (f" ({len(cables)} cable(s) found)" if cables else "")
    layout.reasons = [f"ring: {why}; the ranks connect over {subnet}, which every host is on"]
    for index, host in enumerate(hosts):
        address = addressing.address_in(host, subnet)
        assert address is not None  # every host has one: that is what shared means
        layout.node_ips[index] = address
    return layout
