"""A host of `testkit.netns` gone to sleep, as a Mac that sleeps or is unplugged: every
link down (data and management, so its SSH too) and every process in it stopped."""

from __future__ import annotations

import contextlib

import psutil

from testkit.netns import IP, MultiHost, sh


def freeze(net: MultiHost, i: int) -> list[int]:
    """Host i's links down, then its processes (sshd, agent, ranks) stopped with SIGSTOP,
    by PID; returns those PIDs for `thaw`."""
    _links(net, i, "down")
    pids = net.hosts[i].pids()
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            psutil.Process(pid).suspend()
    return pids


def thaw(net: MultiHost, i: int, pids: list[int]) -> None:
    """Host i awake again: its processes continued (SIGCONT), its links up."""
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            psutil.Process(pid).resume()
    _links(net, i, "up")


def _links(net: MultiHost, i: int, updown: str) -> None:
    size = len(net.hosts)
    ring = [(i - 1) % size, (i + 1) % size]
    peers: list[int | None] = [None] if net.topology == "switch" else list(dict.fromkeys(ring))
    for j in peers:
        (net.link_down if updown == "down" else net.link_up)(i, j)
    sh(IP, "-n", net.hosts[i].ns, "link", "set", "mgmt", updown)
    sh(IP, "link", "set", f"{net.prefix}m{i}", updown)
