"""Free TCP ports on 127.0.0.1 for servers a test or benchmark starts."""

from __future__ import annotations

import socket


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def free_ports(count: int) -> list[int]:
    """Distinct free ports (all bound at once, then released)."""
    socks = []
    try:
        for _ in range(count):
            sock = socket.socket()
            sock.bind(("127.0.0.1", 0))
            socks.append(sock)
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for sock in socks:
            sock.close()


def free_ports_outside(count: int, taken: range) -> list[int]:
    """Distinct free ports, none in `taken` (a rank port block): two separate free_port()
    calls can return the same port, which validation then refuses as a clash."""
    for _ in range(50):
        ports = free_ports(count)
        if not any(port in taken for port in ports):
            return ports
    raise RuntimeError("no free ports outside the block")


def free_port_block(count: int) -> int:
    """A base port whose next `count` ports are all free right now (rank i uses base + i)."""
    for _ in range(50):
        base = free_port()
        if base + count < 65535 and all(_is_free(base + i) for i in range(count)):
            return base
    raise RuntimeError("no block of free ports")


def _is_free(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True
