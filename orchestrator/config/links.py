"""Where each rank listens and which connections a launch makes, from [[nodes]] and [[links]].

MLX's ring backend (mlx/distributed/ring/ring.cpp) gives rank i a list of addresses in
its hostfile: rank i listens on them and rank i-1 connects to them (its right
neighbour). So rank i's addresses are node i's addresses on the cable(s) towards node
i-1, as `mlx.distributed_config` writes them for a Thunderbolt ring, one /30 per cable.
Without [[links]] every rank has one address, its node's `ip` (a switch or a bridge).
JACCL has a coordinator instead: every rank connects to rank 0's `ip`; its [[links]] name
each cable's RDMA devices (see jaccl_devices.py), not addresses.
"""

from __future__ import annotations

import ipaddress
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass

from orchestrator.config.issues import ConfigIssue
from orchestrator.config.jaccl_devices import device_matrix
from orchestrator.config.spec import ClusterSpec, LinkSpec

# Home routers hand out these subnets; a Thunderbolt cable there routes traffic the wrong way.
ROUTER_SUBNETS = (ipaddress.ip_network("192.168.0.0/24"), ipaddress.ip_network("192.168.1.0/24"))


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
    if not spec.links or spec.cluster.backend != "ring":
        return [[Address(node.rank_ip, f"nodes[{i}].ip")] for i, node in enumerate(spec.nodes)]
    names = [node.name for node in spec.nodes]
    found: list[list[Address]] = []
    for rank, name in enumerate(names):
        left, mine = names[rank - 1], []
        for k, link in enumerate(spec.links):
            if set(link.between) == {name, left} and link.ips:
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
    """[[links]] name known nodes, give IPv4 addresses (ring) or RDMA devices (jaccl), and
    cable a ring in [[nodes]] order."""
    if not spec.links:
        return
    names = [node.name for node in spec.nodes]
    valid = True
    for k, link in enumerate(spec.links):
        for issue in _link_issues(k, link, names, spec.cluster.backend):
            valid = valid and issue.severity == "warning"
            yield issue
    if valid:
        yield from _ring_issues(spec, names)


def _link_issues(k: int, link: LinkSpec, names: list[str], backend: str) -> Iterator[ConfigIssue]:
    path, between = f"links[{k}]", link.between
    if backend == "ring" and link.ips is None:
        yield ConfigIssue(
            f"{path}.ips",
            "missing: the ring backend listens on each end's address on the cable",
            f'set ips = ["<{between[0]}\'s address>", "<{between[1]}\'s>"], e.g. a /30 per cable',
        )
    if backend == "ring" and link.rdma is not None:
        yield ConfigIssue(
            f"{path}.rdma", "is only used by the jaccl backend", 'remove it, or backend = "jaccl"'
        )
    if backend == "jaccl" and link.rdma is None:
        yield ConfigIssue(
            f"{path}.rdma",
            "missing: a jaccl ring names each end's RDMA device on the cable",
            f'set rdma = ["<device on {between[0]}>", "<device on {between[1]}>"], e.g. '
            '["rdma_en2", "rdma_en3"] (ibv_devices lists them)',
        )
    for side, device in enumerate(link.rdma or []):
        if not device.strip():
            yield ConfigIssue(
                f"{path}.rdma[{side}]", "is empty", 'name the device, e.g. "rdma_en2"'
            )
    for side, name in enumerate(between):
        if name not in names:
            yield ConfigIssue(
                f"{path}.between[{side}]",
                f"{name!r} is not a node",
                f"use the name of a [[nodes]] table: {', '.join(names)}",
            )
    if between[0] == between[1]:
        yield ConfigIssue(f"{path}.between", "joins a node to itself", "name two nodes")
    yield from _ip_issues(path, link.ips or [])


def _ip_issues(path: str, ips: list[str]) -> Iterator[ConfigIssue]:
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
            continue
        if any(parsed in net for net in ROUTER_SUBNETS):
            yield ConfigIssue(
                f"{path}.ips[{side}]",
                f"{ip} is in a subnet home routers use; a Thunderbolt cable there can take "
                "over the LAN's routes",
                "give each cable its own subnet no other network uses, e.g. 10.10.1.0/30",
                "warning",
            )
    if ips and ips[0] == ips[1]:
        yield ConfigIssue(f"{path}.ips", "gives both ends the same address", "one per end")


def _ring_issues(spec: ClusterSpec, names: list[str]) -> Iterator[ConfigIssue]:
    """Every link joins ring neighbours, every neighbour pair is cabled, equally often."""
    size = len(names)
    order = " -> ".join([*names, names[0]])
    neighbours = {frozenset((names[i], names[(i + 1) % size])) for i in range(size)}
    cables: Counter[frozenset[str]] = Counter()
    what = "addresses" if spec.cluster.backend == "ring" else "RDMA devices"
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
            f'add [[links]] with between = ["{a}", "{b}"] and their {what} on that cable',
        )
    counts = set(cables.values())
    if len(counts) > 1 and not neighbours - set(cables):
        yield ConfigIssue(
            "links",
            f"neighbour pairs have different numbers of cables ({sorted(counts)})",
            "cable every neighbour pair equally often (MLX's ring needs as many "
            "connections to the left as to the right)",
        )


def cable_labels(spec: ClusterSpec) -> dict[int, str]:
    """What carries rank (dst-1) -> dst, by dst, for linktest's per-link table: the
    address(es) the ring backend connects to, or the RDMA devices at both ends (jaccl)."""
    size = spec.world_size
    if spec.cluster.backend != "jaccl":
        found: dict[int, list[str]] = {}
        for hop in hops(spec):
            found.setdefault(hop.dst, []).append(f"{hop.address.ip}:{hop.port}")
        return {dst: ", ".join(labels) for dst, labels in found.items()}
    matrix = device_matrix(spec)

    def names(entry: object) -> str:
        return "+".join(entry) if isinstance(entry, list) else str(entry)

    return {
        dst: f"{names(matrix[(dst - 1) % size][dst])} -> {names(matrix[dst][(dst - 1) % size])}"
        for dst in range(size)
        if size > 1
    }
