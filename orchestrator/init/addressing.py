"""Addresses for what `init` writes: a /30 per cable that has none (and the steps that
give it: printed, and run by `init --apply` only), each node's LAN address, the subnet a
switch shares.

Proposed subnets are 10.10.<k>.0/30, the form docs/mac-setup.md uses: never the
192.168.0.x / 192.168.1.x home routers hand out, and skipping any subnet a host already
has an address in.
"""

from __future__ import annotations

import ipaddress
import shlex
from collections.abc import Iterator
from dataclasses import dataclass

from orchestrator.init.cables import End
from orchestrator.init.probe import HostProbe

# mlx.distributed_config reads a Mac's LAN address from en0, then en1.
LAN_INTERFACES = ("en0", "en1")
LINK_LOCAL = ipaddress.ip_network("169.254.0.0/16")


def used_networks(hosts: list[HostProbe]) -> list[ipaddress.IPv4Network]:
    return [a.network for h in hosts for i in h.interfaces for a in i.ipv4]


def proposed_subnets(hosts: list[HostProbe]) -> Iterator[ipaddress.IPv4Network]:
    """10.10.1.0/30, 10.10.2.0/30, ...: one /24's first /30 each, so a cable's third octet
    numbers it; none overlapping an address the hosts already have."""
    taken = used_networks(hosts)
    for third in range(1, 256):
        subnet = ipaddress.IPv4Network(f"10.10.{third}.0/30")
        if not any(subnet.overlaps(net) for net in taken):
            yield subnet


@dataclass(frozen=True)
class Step:
    """One command that prepares a host: printed as `sudo <argv>`, every word quoted by
    shlex; run as root (through `sudo -n` unless the SSH user is root) by --apply."""

    argv: tuple[str, ...]
    note: str = ""  # printed after the command, as a shell comment
    may_fail: bool = False  # --apply goes on when it fails (it may be done already)

    def __str__(self) -> str:
        return "sudo " + shlex.join(self.argv) + (f"   # {self.note}" if self.note else "")


def setup_steps(host: HostProbe, end: End, address: ipaddress.IPv4Interface,
                peer_name: str) -> list[Step]:
    """What gives this end its address."""
    if host.is_mac:
        service = f"TB {end.interface} to {peer_name}"
        port = end.hardware_port or f"Thunderbolt port of {end.interface}"
        return [
            Step(("networksetup", "-createnetworkservice", service, port),
                 "skip if the port has a service", may_fail=True),
            Step(("networksetup", "-setmanual", service, str(address.ip),
                  str(address.netmask), "")),
        ]
    iface = end.interface or "?"
    return [Step(("ip", "addr", "add", address.with_prefixlen, "dev", iface)),
            Step(("ip", "link", "set", iface, "up"))]


def bridge_steps(host: HostProbe, interfaces: set[str]) -> list[Step]:
    """A Mac's Thunderbolt ports in the Thunderbolt Bridge break RDMA and per-cable subnets
    (docs/mac-setup.md section 3): the commands that take them out, for now."""
    found: list[Step] = []
    for iface in host.interfaces:
        for member in sorted(set(iface.members) & interfaces):
            found.append(Step(
                ("ifconfig", iface.name, "deletem", member),
                "for good: System Settings > Network > Thunderbolt Bridge > "
                "Manage Virtual Interfaces",
            ))
    return found


def ssh_address(target: str) -> str | None:
    """The IPv4 address in an SSH target ("me@10.1.0.11"), if it is one."""
    host = target.rpartition("@")[2].strip("[]")
    try:
        return str(ipaddress.IPv4Address(host))
    except ValueError:
        return None


def lan_address(host: HostProbe, cabled: set[str]) -> str | None:
    """The address other nodes reach this host at over the LAN (JACCL's coordinator): its
    SSH address when that is an IPv4 literal, else en0's or en1's (as mlx does), else any
    up interface's that is not a cable, a bridge or loopback."""
    literal = ssh_address(host.target)
    if literal and any(str(a.ip) == literal for i in host.interfaces for a in i.ipv4):
        return literal
    bridged = {m for i in host.interfaces for m in i.members}
    candidates = [
        i for i in host.interfaces
        if i.ipv4 and not i.loopback and not i.members and i.name not in cabled | bridged
    ]
    candidates.sort(key=lambda i: (i.name not in LAN_INTERFACES, LAN_INTERFACES.index(i.name)
                                   if i.name in LAN_INTERFACES else 0, i.name))
    for iface in candidates:
        for address in iface.ipv4:
            if address.ip not in LINK_LOCAL:
                return str(address.ip)
    return literal


def shared_subnet(hosts: list[HostProbe]) -> ipaddress.IPv4Network | None:
    """A subnet every host has an address in (a switch). One SSH does not go through is
    preferred: a network of its own for the ranks' traffic."""
    sets = [
        {a.network for i in h.interfaces if not i.loopback for a in i.ipv4
         if a.ip not in LINK_LOCAL}
        for h in hosts
    ]
    if not sets:
        return None
    common = set.intersection(*sets)
    ssh = {ipaddress.IPv4Address(a) for h in hosts if (a := ssh_address(h.target))}
    ranked = sorted(common, key=lambda net: (any(a in net for a in ssh), str(net)))
    return ranked[0] if ranked else None


def address_in(host: HostProbe, subnet: ipaddress.IPv4Network) -> str | None:
    return next((str(a.ip) for i in host.interfaces for a in i.ipv4 if a.network == subnet),
                None)
