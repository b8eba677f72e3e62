"""Preflight checks that only matter on real Macs, kept apart from the general checks.

A Thunderbolt port publishes the IPv4-mapped GID that JACCL's queue pairs need only once
its interface has an IPv4 address; without one every rank fails at start with "[jaccl] No
IPv4-mapped GID for this device" (mlx/distributed/jaccl/lib/jaccl/rdma.cpp). The agent
lists each interface's addresses (psutil), so this is seen before anything is launched.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterator, Mapping

from contract.fingerprint import NodeFingerprint
from orchestrator.config import ClusterSpec
from orchestrator.config.jaccl_devices import NodeDevice, node_devices
from orchestrator.preflight.failure import PreflightFailure


def mac_preflight(
    spec: ClusterSpec, fingerprints: Mapping[str, NodeFingerprint]
) -> Iterator[PreflightFailure]:
    for name, devices in node_devices(spec).items():
        fingerprint = fingerprints[name]
        if fingerprint.os.system == "Darwin" and "psutil" not in fingerprint.unavailable:
            yield from _thunderbolt_ipv4(name, devices, fingerprint)


def _thunderbolt_ipv4(
    name: str, devices: list[NodeDevice], fingerprint: NodeFingerprint
) -> Iterator[PreflightFailure]:
    interfaces = {interface.name: interface for interface in fingerprint.interfaces}
    for device in devices:
        interface = interfaces.get(device.interface)
        addresses = interface.addresses if interface else []
        if any(_is_ipv4(address) for address in addresses):
            continue
        has = ", ".join(addresses) if addresses else "no address"
        yield PreflightFailure(
            name,
            "jaccl",
            f"{device.interface} (RDMA device {device.device} towards {device.peer}, "
            f"{device.field}) has no IPv4 address ({has}); JACCL fails with "
            '"No IPv4-mapped GID for this device" without one',
            f"give {device.interface} an IPv4 address: a network service with a manual "
            "address, a subnet per cable (docs/mac-setup.md, section 3), or for this boot "
            f"only `sudo ifconfig {device.interface} inet 169.254.0.1 netmask 255.255.0.0 "
            "alias` as MLX's error suggests (a different address on each Mac)",
        )


def _is_ipv4(address: str) -> bool:
    try:
        return ipaddress.ip_address(address).version == 4
    except ValueError:
        return False
