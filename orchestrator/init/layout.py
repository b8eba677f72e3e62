"""From probed hosts and their cables to what cluster.toml says: the order of the nodes
(rank order), the backend and why, each cable's addresses and RDMA devices, the nodes'
`ip`, and the steps that would prepare what is missing (run by `init --apply` only).

    4+ Macs, every pair cabled, jaccl possible ──▶ a JACCL mesh: each node's `rdma` towards
        every rank (what `mlx.distributed_config` writes for a mesh), no [[links]]
    cables close a ring ──▶ [[links]] in ring order (2 hosts: one cable is the ring)
        every Mac RDMA-enabled, macOS 26.2+, each cable end's rdma_<if> present and not
        shown down by ibv_devinfo ──▶ jaccl
        otherwise ──▶ ring over the cables' addresses (proposed /30s where missing)
    no ring of cables ──▶ ring backend over the subnet every host shares (a switch)
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterator
from dataclasses import dataclass, field

from orchestrator.init import addressing
from orchestrator.init.addressing import Step
from orchestrator.init.cables import Cable, find_cables
from orchestrator.init.probe import HostProbe

JACCL_MIN_MACOS = (26, 2)  # Apple TN3205: RDMA over Thunderbolt
# Three Macs cabled in a ring are also a full mesh: they stay a jaccl ring ([[links]]), as
# before; from four, a full mesh is written as one (every pair one hop apart).
MESH_MIN_HOSTS = 4


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
    node_rdma: dict[int, list[str]] = field(default_factory=dict)  # a mesh: by rank
    cables: list[Cable] = field(default_factory=list)  # every cable found
    steps: dict[int, list[Step]] = field(default_factory=dict)  # host -> to run there
    mesh: list[Cable] = field(default_factory=list)  # a jaccl mesh: one cable per pair
    proposed: list[tuple[Cable, tuple[str, str]]] = field(default_factory=list)  # mesh

    @property
    def commands(self) -> dict[int, list[str]]:
        """The steps as printed: host -> its commands."""
        return {host: [str(step) for step in steps] for host, steps in self.steps.items()}


def plan_layout(hosts: list[HostProbe], names: list[str]) -> Layout:
    cables = find_cables(hosts)
    if len(hosts) == 1:
        return Layout([0], reasons=["one node: no links between ranks"], cables=cables)
    mesh = _mesh_layout(hosts, names, cables)
    if mesh is not None:
        return mesh
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
    return LinkPlan(cable, pair, _propose(layout, hosts, names, pair, cable, subnets),
                    proposed=True)


def _propose(layout: Layout, hosts: list[HostProbe], names: list[str], pair: tuple[int, int],
             cable: Cable, subnets: Iterator[ipaddress.IPv4Network]) -> tuple[str, str]:
    """The next free /30 for a cable with no addresses, and the steps that set it."""
    ends = cable.end(pair[0]), cable.end(pair[1])
    subnet = next(subnets)
    mine = [ipaddress.IPv4Interface(f"{subnet.network_address + k}/30") for k in (1, 2)]
    for end, address, peer in zip(ends, mine, reversed(pair), strict=True):
        steps = addressing.setup_steps(hosts[end.host], end, address, names[peer])
        layout.steps.setdefault(end.host, []).extend(steps)
    return str(mine[0].ip), str(mine[1].ip)


def _choose_backend(layout: Layout, hosts: list[HostProbe]) -> None:
    cables = [link.cable for link in layout.links]
    _bridge_steps(layout, hosts, cables)
    cabling = f"{len(layout.links)} cable(s) close a ring in this node order"
    missing = list(_jaccl_missing(cables, hosts))
    if missing:
        layout.reasons = [f"ring: {cabling}; jaccl (RDMA) is not possible because", *missing]
        return
    layout.backend = "jaccl"
    layout.reasons = [
        f"jaccl: {cabling}, every Mac has RDMA enabled on macOS 26.2+ and an RDMA device "
        "on each cable end (JACCL's latency is far below the TCP ring's)",
    ]
    pairs = len({c.hosts for c in layout.cables})
    full = len(hosts) * (len(hosts) - 1) // 2
    if len(hosts) >= MESH_MIN_HOSTS and pairs < full:
        layout.reasons.append(
            f"not a full mesh ({pairs} of the {full} pairs of Macs cabled): JACCL's ring "
            "mode (what `mlx.distributed_config` writes as jaccl-ring), whose all-reduce "
            "goes round the ring in steps and whose sends reach only the two neighbours. "
            "Tensor parallel all-reduces every layer: cable every pair for a mesh, or "
            'set [cluster] parallel = "pipeline" (neighbour sends only)')
    for link in layout.links:
        a, b = (link.cable.end(h).interface for h in link.between)
        link.rdma = (f"rdma_{a}", f"rdma_{b}")
    _lan_ips(layout, hosts, cables)


def _bridge_steps(layout: Layout, hosts: list[HostProbe], cables: list[Cable]) -> None:
    used = {(end.host, end.interface) for cable in cables for end in cable.ends}
    for index, host in enumerate(hosts):
        bridge = addressing.bridge_steps(host, {i for h, i in used if h == index and i})
        if bridge:
            layout.steps.setdefault(index, [])[:0] = bridge


def _lan_ips(layout: Layout, hosts: list[HostProbe], cables: list[Cable]) -> None:
    """Each node's LAN address: JACCL's coordinator is reached there, not over a cable."""
    used = {(end.host, end.interface) for cable in cables for end in cable.ends}
    for index, host in enumerate(hosts):
        address = addressing.lan_address(host, {i for h, i in used if h == index and i})
        if address is None:
            raise InitError(f"{host.target}: no LAN address found for JACCL's coordinator "
                            "(en0 or en1); connect it to the LAN or give it an address")
        layout.node_ips[index] = address


def _jaccl_missing(cables: list[Cable], hosts: list[HostProbe]) -> Iterator[str]:
    if {cable.kind for cable in cables} != {"thunderbolt"}:
        yield "  the cables are not Thunderbolt between Macs (RDMA over Thunderbolt is macOS only)"
        return
    for cable in cables:
        if cable.thunderbolt5 is False:
            a, b = (hosts[end.host].target for end in cable.ends)
            yield f"  the cable {a} - {b} is {cable.speed}: RDMA needs Thunderbolt 5"
    for index, host in enumerate(hosts):
        if _version(host.os_version) < JACCL_MIN_MACOS:
            yield f"  {host.target}: macOS {host.os_version}; RDMA needs 26.2 or later"
            continue
        if host.rdma_status != "enabled":
            yield (f"  {host.target}: rdma_ctl status is {host.rdma_status} (enable it in "
                   "macOS Recovery: docs/mac-setup.md section 2)")
            continue
        for cable in cables:
            end = cable.end(index) if index in cable.hosts else None
            device = f"rdma_{end.interface}" if end else None
            if device and device not in host.rdma_devices:
                yield f"  {host.target}: no device {device} in ibv_devices"
            elif device in host.rdma_down:  # TN3205: active once both ends have RDMA on
                yield (f"  {host.target}: {device} has no active port (ibv_devinfo): RDMA "
                       "is off at the cable's other end, or the port does none (on a Mac "
                       "Studio the Thunderbolt port next to Ethernet: exo's README)")


def _mesh_layout(hosts: list[HostProbe], names: list[str], cables: list[Cable]) -> Layout | None:
    """4+ Macs with every pair cabled and jaccl possible on one cable per pair: a JACCL
    mesh in the order given, each node's device towards each rank (MLX's hostfile for
    jaccl); None when that is not the case (a ring is tried then)."""
    size = len(hosts)
    if size < MESH_MIN_HOSTS:
        return None
    chosen: dict[frozenset[int], Cable] = {}
    for cable in sorted(cables, key=lambda c: tuple(e.interface or "" for e in c.ends)):
        chosen.setdefault(cable.hosts, cable)
    if len(chosen) < size * (size - 1) // 2 or list(_jaccl_missing(list(chosen.values()), hosts)):
        return None
    layout = Layout(list(range(size)), backend="jaccl", cables=cables)
    layout.reasons = [
        f"jaccl: a full mesh ({len(chosen)} cables, one per pair of Macs), every Mac has "
        "RDMA enabled on macOS 26.2+ and an RDMA device on each cable end: each rank "
        "reaches every other in one hop, what tensor parallel's all-reduce needs",
    ]
    mesh = layout.mesh = list(chosen.values())
    _bridge_steps(layout, hosts, mesh)
    subnets = addressing.proposed_subnets(hosts)
    for index in range(size):
        layout.node_rdma[index] = [
            "" if peer == index else
            f"rdma_{chosen[frozenset((index, peer))].end(index).interface}"
            for peer in range(size)
        ]
    for cable in mesh:  # RDMA needs an IPv4 address on each end (preflight checks it)
        if not cable.addressed:
            pair = tuple(sorted(cable.hosts))
            ips = _propose(layout, hosts, names, (pair[0], pair[1]), cable, subnets)
            layout.proposed.append((cable, ips))
    _lan_ips(layout, hosts, mesh)
    return layout


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
