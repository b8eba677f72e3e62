"""Thunderbolt ports and hardware ports, parsed from (reconstructed) Mac recordings."""

from __future__ import annotations

from node_agent.probes.thunderbolt import (
    is_thunderbolt5,
    parse_hardware_ports,
    parse_thunderbolt,
)
from testkit.paths import FIXTURES

PAIR = FIXTURES / "macs" / "studio-pair-tb5-rdma"


def test_ports_name_the_uuid_at_the_cables_other_end() -> None:
    """studio-a's port 1 is cabled to studio-b's port 2; its other ports are empty."""
    a = parse_thunderbolt((PAIR / "studio-a" / "thunderbolt.txt").read_text())
    b = parse_thunderbolt((PAIR / "studio-b" / "thunderbolt.txt").read_text())
    assert [p.receptacle for p in a] == ["1", "2", "3", "4"]
    assert a[0].connected_to == b[1].uuid and b[1].connected_to == a[0].uuid
    assert a[0].peer_name == "Mac Studio" and a[0].speed == "Up to 80 Gb/s"
    assert [p.connected_to for p in a[1:]] == [None, None, None]


def test_an_entry_without_a_domain_uuid_is_skipped() -> None:
    """As mlx's distributed_config does: a bus with no domain UUID is not a port."""
    text = '{"SPThunderboltDataType": [{"_name": "x", "receptacle_1_tag": {}}]}'
    assert parse_thunderbolt(text) == []


def test_hardware_ports_map_thunderbolt_n_to_its_interface() -> None:
    """`networksetup -listallhardwareports`: "Thunderbolt 2" is en3 here."""
    ports = parse_hardware_ports((PAIR / "studio-a" / "hardware_ports.txt").read_text())
    assert ports["Thunderbolt 1"] == "en2" and ports["Thunderbolt 2"] == "en3"
    assert ports["Ethernet"] == "en0" and ports["Thunderbolt Bridge"] == "bridge0"


def test_thunderbolt5_is_80_gbps_or_more() -> None:
    """80 and 120 Gb/s are Thunderbolt 5, 40 is 4, no speed is unknown."""
    assert [is_thunderbolt5(s) for s in ("Up to 80 Gb/s", "Up to 120 Gb/s", "Up to 40 Gb/s",
                                         None)] == [True, True, False, None]
