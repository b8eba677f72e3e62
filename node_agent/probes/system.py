"""Memory, network interfaces and disk: psutil when the node's Python has it,
otherwise what the standard library can tell (the fingerprint says which)."""

from __future__ import annotations

import os
import shutil
import socket
from pathlib import Path
from types import ModuleType

from contract.fingerprint import DiskInfo, MemoryInfo, NetInterface


def load_psutil() -> ModuleType | None:
    try:
        import psutil
    except ImportError:
        return None
    return psutil


def memory(psutil: ModuleType | None) -> MemoryInfo | None:
    if psutil is not None:
        vm = psutil.virtual_memory()
        return MemoryInfo(total_bytes=int(vm.total), available_bytes=int(vm.available))
    try:
        page = os.sysconf("SC_PAGE_SIZE")
        total = os.sysconf("SC_PHYS_PAGES") * page
    except (ValueError, OSError):
        return None
    try:
        available: int | None = os.sysconf("SC_AVPHYS_PAGES") * page  # Linux only
    except (ValueError, OSError):
        available = None
    return MemoryInfo(total_bytes=total, available_bytes=available)


def interfaces(psutil: ModuleType | None) -> list[NetInterface]:
    if psutil is None:
        return [NetInterface(name=name) for _, name in socket.if_nameindex()]
    stats = psutil.net_if_stats()
    found: list[NetInterface] = []
    for name, addrs in sorted(psutil.net_if_addrs().items()):
        ips = [
            a.address.split("%", 1)[0]  # fe80::1%en0 -> fe80::1
            for a in addrs
            if a.family in (socket.AF_INET, socket.AF_INET6)
        ]
        up = stats[name].isup if name in stats else None
        found.append(NetInterface(name=name, addresses=ips, is_up=up))
    return found


def disk(path: Path) -> DiskInfo:
    """Free space on the filesystem of path, or of its nearest existing parent."""
    probe = path
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    usage = shutil.disk_usage(probe)
    return DiskInfo(path=str(probe), total_bytes=usage.total, free_bytes=usage.free)
