"""Parsers for what macOS says about its Thunderbolt ports, the way `mlx.distributed_config`
reads it (mlx/_distributed_utils/config.py, `extract_connectivity`):

    $ system_profiler SPThunderboltDataType -json
    {"SPThunderboltDataType": [                       one entry per port (a bus)
      {"domain_uuid_key": "<this port's UUID>",
       "receptacle_1_tag": {"receptacle_id_key": "2", "current_speed_key": "Up to 80 Gb/s"},
       "_items": [{"domain_uuid_key": "<UUID of the port at the cable's other end>",
                   "_name": "Mac Studio", "device_name_key": "Mac15,14", ...}]}, ...]}

    $ networksetup -listallhardwareports
    Hardware Port: Thunderbolt 2                      receptacle 2 is interface en3
    Device: en3

A cable between two Macs shows on each end as a connected item carrying the other port's
domain UUID: matching UUIDs across hosts finds the cables. A drive or dock on a port is an
item without one (real captures: tests/fixtures/README.md): it is no cable to a Mac, and
`mlx.distributed_config`, which reads `_items[0]["domain_uuid_key"]`, fails on it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass


@dataclass(frozen=True)
class ThunderboltPort:
    receptacle: str  # "2": the "Thunderbolt 2" hardware port
    uuid: str  # this port's domain UUID
    connected_to: str | None  # the domain UUID at the other end of its cable, if a Mac
    peer_name: str | None = None  # the Mac at the other end ("Mac Studio", its `_name`)
    speed: str | None = None  # "80 Gb/s" connected over TB5; "Up to 120 Gb/s" idle TB5
    device: str | None = None  # a drive or dock on the port, not a Mac ("Envoy Ultra")


def parse_thunderbolt(text: str) -> list[ThunderboltPort]:
    """Every port with a domain UUID (as mlx does: entries without one are skipped)."""
    data = json.loads(text)
    ports: list[ThunderboltPort] = []
    for entry in data.get("SPThunderboltDataType", []):
        uuid = entry.get("domain_uuid_key")
        tag = entry.get("receptacle_1_tag") or {}
        receptacle = tag.get("receptacle_id_key")
        if uuid is None or receptacle is None:
            continue
        items = entry.get("_items", [])
        macs = [item for item in items if "domain_uuid_key" in item]
        others = [item for item in items if "domain_uuid_key" not in item]
        peer = macs[0] if macs else {}
        ports.append(
            ThunderboltPort(
                receptacle=str(receptacle),
                uuid=uuid,
                connected_to=peer.get("domain_uuid_key"),
                peer_name=peer.get("_name") or peer.get("device_name_key"),
                speed=tag.get("current_speed_key"),
                device=(others[0].get("_name") or others[0].get("device_name_key") or
                        "a device") if others else None,
            )
        )
    return ports


def parse_hardware_ports(text: str) -> dict[str, str]:
    """Hardware port name -> interface: {"Thunderbolt 2": "en3", "Ethernet": "en0", ...}."""
    ports: dict[str, str] = {}
    name: str | None = None
    for line in text.splitlines():
        if line.startswith("Hardware Port:"):
            name = line.partition(":")[2].strip()
        elif line.startswith("Device:") and name is not None:
            ports[name] = line.partition(":")[2].strip()
            name = None
    return ports


def is_thunderbolt5(speed: str | None) -> bool | None:
    """Whether a port's link speed is Thunderbolt 5's (80 Gb/s or more); None: not said."""
    if not speed:
        return None
    digits = "".join(ch if ch.isdigit() else " " for ch in speed).split()
    return bool(digits) and int(digits[0]) >= 80
