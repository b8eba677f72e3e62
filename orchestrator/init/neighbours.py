"""Cables with no IPv4 address between Linux hosts: which interface faces which host.

Macs name the far end of a Thunderbolt cable (system_profiler); Linux says nothing, and a
cable with no address has no subnet to match. Every interface that is up has an IPv6
link-local address, though: each host sends one UDP datagram from each of its unaddressed
interfaces to each other host's unaddressed interfaces' link-local addresses (port 9, the
discard port, which nothing listens on). A peer on that cable answers with ICMPv6 "port
unreachable", which a connected socket reports as ConnectionRefusedError; a peer that is
not on it never answers. Stdlib Python, no root, nothing on the host changed.
"""

from __future__ import annotations

import asyncio
import json

from orchestrator.init.probe import HostProbe, Runner

DISCARD_PORT = 9
PROBE_WAIT_S = 1.5
# argv[1]: [[interface, peer link-local address], ...]; prints the pairs that answered.
NEIGHBOUR_PROBE = f"""
import json, socket, sys, time
waiting, found = [], []
for iface, address in json.loads(sys.argv[1]):
    s = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    s.setblocking(False)
    try:
        s.connect((address, {DISCARD_PORT}, 0, socket.if_nametoindex(iface)))
        s.send(b"mlx-cluster-orchestrator init: which host is on this cable?")
    except OSError:
        continue
    waiting.append((iface, address, s))
deadline = time.monotonic() + {PROBE_WAIT_S}
while waiting and time.monotonic() < deadline:
    time.sleep(0.05)
    rest = []
    for iface, address, s in waiting:
        try:
            s.recv(64)
        except BlockingIOError:
            rest.append((iface, address, s))
            continue
        except ConnectionRefusedError:
            pass
        except OSError:
            continue
        found.append([iface, address])
    waiting = rest
print(json.dumps(found))
"""


def unaddressed(host: HostProbe) -> dict[str, str]:
    """Interface -> link-local address, for interfaces that are up with no IPv4 address."""
    return {
        i.name: host.link_local[i.name] for i in host.interfaces
        if i.up and not i.loopback and not i.ipv4 and i.name in host.link_local
    }


def candidates(hosts: list[HostProbe]) -> dict[int, list[tuple[str, str]]]:
    """For each Linux host with unaddressed interfaces: (its interface, a peer's address)."""
    found: dict[int, list[tuple[str, str]]] = {}
    for i, host in enumerate(hosts):
        if host.is_mac:
            continue
        peers = [address for j, other in enumerate(hosts) if j != i and not other.is_mac
                 for address in unaddressed(other).values()]
        pairs = [(iface, address) for iface in unaddressed(host) for address in peers]
        if pairs:
            found[i] = pairs
    return found


async def find_neighbours(hosts: list[HostProbe], runners: list[Runner],
                          pythons: list[str]) -> None:
    """Fill each Linux host's `neighbours`: (its interface, the peer address it reached).
    The hosts probe at once: each waits PROBE_WAIT_S for the peers that never answer, so
    one after another took that wait once per host (4.5 s for a ring of 3)."""
    await asyncio.gather(*(_probe_neighbours(hosts[index], runners[index], pythons[index], pairs)
                           for index, pairs in candidates(hosts).items()))


async def _probe_neighbours(host: HostProbe, runner: Runner, python: str,
                            pairs: list[tuple[str, str]]) -> None:
    argv = [python, "-c", NEIGHBOUR_PROBE, json.dumps(pairs)]
    try:
        done = await runner("neighbours", argv)
    except (OSError, TimeoutError) as exc:
        host.notes.append(f"finding cables without addresses: {exc}")
        return
    try:
        answered = json.loads(done.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        host.notes.append("finding cables without addresses: "
                          f"{(done.stderr or done.stdout).strip()[-200:]}")
        return
    host.neighbours = [(str(iface), str(address)) for iface, address in answered]
