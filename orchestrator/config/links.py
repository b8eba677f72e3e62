"""Where each rank listens and which connections a launch makes, from [[nodes]] and [[links]].

MLX's ring backend (mlx/distributed/ring/ring.cpp) gives rank i a list of addresses in
its hostfile: rank i listens on them and rank i-1 connects to them (its right
neighbour). So rank i's addresses are node i's addresses on the cable(s) towards node
i-1, as `mlx.distributed_config` writes them for a Thunderbolt ring, one /30 per cable.
Without [[links]] every rank has one address, its node's `ip` (a switch or a bridge).
JACCL has a coordinator instead: every rank connects to rank 0's `ip`.
"""

from __future__ import annotations

import ipaddress
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass

from orchestrator.config.issues import ConfigIssue
from orchestrator.config.spec import ClusterSpec


@dataclass(frozen=True)
class Address:
    ip: str
    field: str  # where cluster.toml sets it: "nodes[1].ip", "links[0].ips[1]"


@dataclass(frozen=True)
class Hop:
    """A connection rank `src` opens to rank `dst` when a launch starts."""

    src: int
    dst: int
    address: Address
    port: int


def rank_addresses(spec: ClusterSpec) -> list[list[Address]]:
    """The addresses each rank listens on (ring) or is reached at, in rank order."""
    if not spec.links:
        return [[Address(node.rank_ip, f"nodes[{i}].ip")] for i, node in enumerate(spec.nodes)]
    names = [node.name for node in spec.nodes]
    found: list[list[Address]] = []
    for rank, name in enumerate(names):
        left, mine = names[rank - 1], []
        for k, link in enumerate(spec.links):
            if set(link.between) == {name, left}:
                side = link.between.index(name)
                mine.append(Address(link.ips[side], f"links[{k}].ips[{side}]"))
        found.append(mine)
    return found


def hops(spec: ClusterSpec) -> list[Hop]:
    """Every connection a launch opens between ranks (what preflight checks and the agents
    watch while serving)."""
    size, port = spec.world_size, spec.cluster.rank_port
    if size == 1:
        return []
    if spec.cluster.backend == "jaccl":
        coordinator = Address(spec.nodes[0].rank_ip, "nodes[0].ip")
        return [Hop(src, 0, coordinator, port) for src in range(1, size)]
    return [
        Hop((dst - 1) % size, dst, address, port + dst)
        for dst, addresses in enumerate(rank_addresses(spec))
        for address in addresses
    ]


def link_issues(spec: ClusterSpec) -> Iterator[ConfigIssue]:
    """[[links]] name known nodes, give IPv4 addresses, and cable a ring in [[nodes]] order."""
    if not spec.links:
        return
    if spec.cluster.backend != "ring":
        yield ConfigIssue("links", "is only used by the ring backend", "remove [[links]]")
        return
    names = [node.name for node in spec.nodes]
    valid = True
    for k, link in enumerate(spec.links):
        for issue in _link_issues(k, link.between, link.ips, names):
            valid = False
            yield issue
    if valid:
        yield from _ring_issues(spec, names)


def _link_issues(
    k: int, between: list[str], ips: list[str], names: list[str]
) -> Iterator[ConfigIssue]:
    path = f"links[{k}]"
    for side, name in enumerate(between):
        if name not in names:
            yield ConfigIssue(
                f"{path}.between[{side}]",
                f"{name!r} is not a node",
                f"use the name of a [[nodes]] table: {', '.join(names)}",
            )
    if between[0] == between[1]:
        yield ConfigIssue(f"{path}.between", "joins a node to itself", "name two nodes")
    for side, ip in enumerate(ips):
        try:
            parsed = ipaddress.ip_address(ip)
        except ValueError:
            yield ConfigIssue(
                f"{path}.ips[{side}]", f"{ip!r} is not an IP address", 'e.g. "10.0.1.1"'
            )
            continue
        if parsed.version != 4:
            yield ConfigIssue(
                f"{path}.ips[{side}]",
                f"{ip} is IPv6; MLX's ring backend connects over IPv4 only",
                "give the cable IPv4 addresses, e.g. a /30 per cable",
            )
    if ips[0] == ips[1]:
        yield ConfigIssue(f"{path}.ips", "gives both ends the same address", "one per end")


def _ring_issues(spec: ClusterSpec, names: list[str]) -> Iterator[ConfigIssue]:
    """Every link joins ring neighbours, every neighbour pair is cabled, equally often."""
    size = len(names)
    order = " -> ".join([*names, names[0]])
    neighbours = {frozenset((names[i], names[(i + 1) % size])) for i in range(size)}
    cables: Counter[frozenset[str]] = Counter()
    for k, link in enumerate(spec.links):
        pair = frozenset(link.between)
        if pair not in neighbours:
            yield ConfigIssue(
                f"links[{k}].between",
                f"{link.between[0]} and {link.between[1]} are not neighbours in the ring "
                f"{order} (the order of [[nodes]])",
                "reorder [[nodes]] so cabled nodes are adjacent, or remove this link",
            )
        cables[pair] += 1
    reported = set(cables)
    for a, b in ((names[i], names[(i + 1) % size]) for i in range(size)):
        if frozenset((a, b)) in reported:
            continue
        reported.add(frozenset((a, b)))
        yield ConfigIssue(
            "links",
            f"no link between {a} and {b}: the ring {order} is not closed",
            f'add [[links]] with between = ["{a}", "{b}"] and their addresses on that cable',
        )
    counts = set(cables.values())
    if len(counts) > 1 and not neighbours - set(cables):
        yield ConfigIssue(
            "links",
            f"neighbour pairs have different numbers of cables ({sorted(counts)})",
            "cable every neighbour pair equally often (MLX's ring needs as many "
            "connections to the left as to the right)",
        )
