"""Interface addresses with prefixes: macOS ifconfig and Linux `ip -j addr`."""

from __future__ import annotations

import ipaddress
import json

from node_agent.probes.addresses import parse_ifconfig, parse_ip_addr_json
from testkit.paths import FIXTURES

MACS = FIXTURES / "macs"


def test_ifconfig_gives_prefixes_bridge_members_and_state() -> None:
    """A netmask in hex becomes a prefix; bridge0 lists its members; an inactive port is down."""
    found = {i.name: i for i in parse_ifconfig(
        (MACS / "mini-trio-tb4-ring" / "mini-1" / "ifconfig.txt").read_text())}
    assert found["en2"].ipv4 == [ipaddress.IPv4Interface("10.0.1.1/30")]
    assert found["en0"].ipv4 == [ipaddress.IPv4Interface("192.168.1.20/24")]
    assert found["lo0"].loopback and found["en2"].up and not found["en4"].up
    bridged = {i.name: i for i in parse_ifconfig(
        (MACS / "studio-pair-tb5-rdma" / "studio-a" / "ifconfig.txt").read_text())}
    assert bridged["bridge0"].members == ["en2"] and bridged["en2"].ipv4 == []


def test_ip_json_gives_each_interfaces_ipv4_with_prefix() -> None:
    """`ip -j addr show` as iproute2 prints it: IPv6 left out, loopback flagged."""
    text = json.dumps([
        {"ifname": "lo", "flags": ["LOOPBACK", "UP"], "addr_info": [
            {"family": "inet", "local": "127.0.0.1", "prefixlen": 8}]},
        {"ifname": "c1", "flags": ["BROADCAST", "UP", "LOWER_UP"], "addr_info": [
            {"family": "inet", "local": "198.19.7.1", "prefixlen": 30},
            {"family": "inet6", "local": "fe80::1", "prefixlen": 64}]},
    ])
    lo, c1 = parse_ip_addr_json(text)
    assert lo.loopback and not c1.loopback and c1.up
    assert c1.ipv4 == [ipaddress.IPv4Interface("198.19.7.1/30")]
