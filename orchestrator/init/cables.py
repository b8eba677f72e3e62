"""The cables between probed hosts.

Macs: a Thunderbolt port whose connected item carries another probed port's domain UUID
is one end of a cable (as `mlx.distributed_config` matches them). Linux hosts (and the
namespace hosts of the tests): a point-to-point subnet, one of a /30 or /31 holding this
interface's address and exactly one other host's, is a cable; so is an interface with no
address whose link-local neighbour is another host's (neighbours.py). A subnet every host
shares is a switch, not a cable (network.py).
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from node_agent.probes.thunderbolt import is_thunderbolt5
from orchestrator.init.probe import HostProbe, TbPort

POINT_TO_POINT_PREFIX = 30  # a /30 or /31 has room for exactly two hosts


@dataclass(frozen=True)
class End:
    host: int  # index into the probed hosts
    interface: str | None  # "en3", "c1"; None: Thunderbolt port with no interface known
    address: ipaddress.IPv4Interface | None  # its IPv4 address on this cable, if any
    hardware_port: str | None = None  # macOS's name of the port: "Thunderbolt 2"


@dataclass(frozen=True)
class Cable:
    ends: tuple[End, End]
    kind: str  # "thunderbolt" or "point-to-point"
    speed: str | None = None  # Thunderbolt: "Up to 80 Gb/s"

    @property
    def hosts(self) -> frozenset[int]:
        return frozenset(end.host for end in self.ends)

    def end(self, host: int) -> End:
        return self.ends[0] if self.ends[0].host == host else self.ends[1]

    @property
    def thunderbolt5(self) -> bool | None:
        return is_thunderbolt5(self.speed) if self.kind == "thunderbolt" else None

    @property
    def addressed(self) -> bool:
        """Both ends have an IPv4 address, in one subnet."""
        a, b = (end.address for end in self.ends)
        return a is not None and b is not None and a.network == b.network


def find_cables(hosts: list[HostProbe]) -> list[Cable]:
    if hosts and all(host.is_mac for host in hosts):
        return thunderbolt_cables(hosts)
    return point_to_point_cables(hosts)


def thunderbolt_cables(hosts: list[HostProbe]) -> list[Cable]:
    owner = {p.port.uuid: (i, p) for i, host in enumerate(hosts) for p in host.thunderbolt}
    cables: list[Cable] = []
    seen: set[str] = set()
    for i, host in enumerate(hosts):
        for port in host.thunderbolt:
            peer = port.port.connected_to
            if peer is None or peer not in owner or port.port.uuid in seen:
                continue
            j, other = owner[peer]
            if j == i:
                continue
            seen.update((port.port.uuid, peer))
            ends = (_tb_end(i, host, port), _tb_end(j, hosts[j], other))
            cables.append(Cable(ends, "thunderbolt", port.port.speed or other.port.speed))
    return cables


def _tb_end(index: int, host: HostProbe, port: TbPort) -> End:
    iface = next((i for i in host.interfaces if i.name == port.interface), None)
    address = iface.ipv4[0] if iface and iface.ipv4 else None
    return End(index, port.interface, address, f"Thunderbolt {port.port.receptacle}")


def point_to_point_cables(hosts: list[HostProbe]) -> list[Cable]:
    cables: list[Cable] = []
    for i, host in enumerate(hosts):
        for iface in host.interfaces:
            for address in iface.ipv4:
                if iface.loopback or address.network.prefixlen < POINT_TO_POINT_PREFIX:
                    continue
                peers = [
                    (j, other_iface, other)
                    for j, peer in enumerate(hosts)
                    if j != i
                    for other_iface in peer.interfaces
                    for other in other_iface.ipv4
                    if other.network == address.network and other.ip != address.ip
                ]
                if len(peers) != 1 or peers[0][0] < i:
                    continue  # not point to point, or found from the other end already
                j, other_iface, other = peers[0]
                ends = (End(i, iface.name, address), End(j, other_iface.name, other))
                cables.append(Cable(ends, "point-to-point"))
    return cables + unaddressed_cables(hosts)


def unaddressed_cables(hosts: list[HostProbe]) -> list[Cable]:
    """Cables with no address yet, from the link-local neighbours a host reached
    (neighbours.py): one per pair of interfaces, whichever end found it."""
    owner = {address: (j, iface) for j, host in enumerate(hosts)
             for iface, address in host.link_local.items()}
    cables: list[Cable] = []
    seen: set[frozenset[tuple[int, str]]] = set()
    for i, host in enumerate(hosts):
        for iface, address in host.neighbours:
            if address not in owner or owner[address][0] == i:
                continue
            j, other = owner[address]
            key = frozenset(((i, iface), (j, other)))
            if key not in seen:
                seen.add(key)
                cables.append(Cable((End(i, iface, None), End(j, other, None)),
                                    "point-to-point"))
    return cables
