"""Parsers for each interface's addresses with their prefix lengths: macOS `ifconfig` and
Linux `ip -j addr show` (the agent's psutil view has no prefixes; finding which hosts
share a subnet needs them).

    $ ifconfig                                     $ ip -j addr show
    en2: flags=8863<UP,BROADCAST,...> mtu 1500     [{"ifname": "c1", "flags": ["UP", ...],
    \tinet 10.10.1.1 netmask 0xfffffffc ...          "addr_info": [{"family": "inet",
    \tstatus: active                                 "local": "198.19.7.1", "prefixlen": 30}]}]
    bridge0: flags=8863<UP,...> mtu 1500
    \tmember: en2 flags=3<LEARNING,DISCOVER>
"""

from __future__ import annotations

import ipaddress
import json
from dataclasses import dataclass, field


@dataclass
class InterfaceAddresses:
    name: str
    ipv4: list[ipaddress.IPv4Interface] = field(default_factory=list)  # address/prefix
    up: bool | None = None
    members: list[str] = field(default_factory=list)  # a bridge's member interfaces
    loopback: bool = False


def parse_ifconfig(text: str) -> list[InterfaceAddresses]:
    found: list[InterfaceAddresses] = []
    current: InterfaceAddresses | None = None
    for line in text.splitlines():
        if line and not line[0].isspace():
            name, _, rest = line.partition(":")
            flags = rest.partition("<")[2].partition(">")[0].split(",")
            current = InterfaceAddresses(name.strip(), up="UP" in flags,
                                         loopback="LOOPBACK" in flags)
            found.append(current)
            continue
        words = line.split()
        if current is None or not words:
            continue
        if words[0] == "inet" and "netmask" in words:
            mask = words[words.index("netmask") + 1]
            prefix = bin(int(mask, 16)).count("1") if mask.startswith("0x") else mask
            current.ipv4.append(ipaddress.IPv4Interface(f"{words[1]}/{prefix}"))
        elif words[0] == "member:" and len(words) > 1:
            current.members.append(words[1])
        elif words[0] == "status:" and len(words) > 1:
            current.up = bool(current.up) and words[1] == "active"
    return found


def parse_ip_addr_json(text: str) -> list[InterfaceAddresses]:
    found: list[InterfaceAddresses] = []
    for link in json.loads(text):
        flags = link.get("flags", [])
        iface = InterfaceAddresses(link["ifname"], up="UP" in flags, loopback="LOOPBACK" in flags)
        for info in link.get("addr_info", []):
            if info.get("family") == "inet":
                iface.ipv4.append(ipaddress.IPv4Interface(f"{info['local']}/{info['prefixlen']}"))
        found.append(iface)
    return found
