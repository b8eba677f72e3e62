"""Parsers for the RDMA tools of macOS (RDMA over Thunderbolt) and rdma-core.

    $ rdma_ctl status        $ ibv_devices                      $ ibv_devinfo -v
    enabled                      device          node GUID      hca_id:\trdma_en2
                                 ------       ----------------  \ttransport:\t\t\tThunderbolt (100)
                                 rdma_en2     e0c5797d9c8fac05  \t\tport:\t1
                                                                \t\t\tstate:\t\t\tPORT_ACTIVE (4)

Fixture files in tests/fixtures/ hold full recordings and say where each came from.
"""

from __future__ import annotations

import re
from typing import Literal

from contract.fingerprint import RdmaDevice, RdmaPort

_CODE_SUFFIX = re.compile(r"\s*\(\d+\)\s*$")  # "PORT_ACTIVE (4)" -> "PORT_ACTIVE"
NO_DEVICES = "No IB devices found"


def parse_rdma_ctl_status(text: str) -> Literal["enabled", "disabled"]:
    word = text.strip().lower()
    if word.startswith("enabled"):
        return "enabled"
    if word.startswith("disabled"):
        return "disabled"
    raise ValueError(f"unexpected rdma_ctl status output: {text.strip()[:200]!r}")


def parse_ibv_devices(text: str) -> list[str]:
    """Device names, in the tool's order; the header alone means no device."""
    names: list[str] = []
    for line in text.splitlines():
        tokens = line.split()
        if not tokens or tokens[0] == "device" or tokens[0].startswith("-"):
            continue
        if NO_DEVICES.lower() in line.lower():
            continue
        names.append(tokens[0])
    return names


def _strip_code(value: str) -> str:
    return _CODE_SUFFIX.sub("", value).strip()


def _apply_port_field(port: RdmaPort, key: str, value: str) -> None:
    if key == "state":
        port.state = _strip_code(value)
        port.active = port.state == "PORT_ACTIVE"
    elif key == "link_layer":
        port.link_layer = value
    elif key == "active_mtu":
        port.active_mtu = _strip_code(value)
    elif key == "active_width":
        port.active_width = _strip_code(value)
    elif key == "active_speed":
        port.active_speed = _strip_code(value)


def parse_ibv_devinfo(text: str) -> list[RdmaDevice]:
    """Devices with their ports; works on both plain and `-v` output."""
    devices: list[RdmaDevice] = []
    device: RdmaDevice | None = None
    port: RdmaPort | None = None
    for line in text.splitlines():
        key, sep, value = line.strip().partition(":")
        if not sep:
            continue  # continuation lines of flag lists, blank lines
        key, value = key.strip(), value.strip()
        if key == "hca_id":
            device = RdmaDevice(name=value)
            devices.append(device)
            port = None
        elif device is None:
            continue
        elif key == "port":
            port = RdmaPort(port=int(value), state="UNKNOWN", active=False)
            device.ports.append(port)
        elif port is not None:
            _apply_port_field(port, key, value)
        elif key == "transport":
            device.transport = value
        elif key == "node_guid":
            device.node_guid = value
    return devices
