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


def cluster_ports(ranks: int) -> tuple[int, int, int]:
    """(rank_port, api port, rank_api_port) for a cluster of `ranks`: a free block for the
    ranks and two distinct free ports outside it (two separate free_port() calls can return
    the same port, which validation then refuses as a clash)."""
    rank_port = free_port_block(ranks)
    block = range(rank_port, rank_port + ranks)
    for _ in range(50):
        api_port, rank_api_port = free_ports(2)
        if api_port not in block and rank_api_port not in block:
            return rank_port, api_port, rank_api_port
    raise RuntimeError("no free ports outside the rank block")


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
