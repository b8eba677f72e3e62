"""init's connections: one transport per host, open from the first probe to the last
(a second probe after --apply, the neighbour probe, the steps), closed together."""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass

from orchestrator.config import NodeSpec
from orchestrator.init.layout import InitError
from orchestrator.init.neighbours import find_neighbours
from orchestrator.init.probe import HostProbe, Runner, probe_host
from orchestrator.init.render import Access
from orchestrator.init.targets import Target
from orchestrator.transports import Completed, Transport, transport_for

COMMAND_TIMEOUT_S = 60.0  # system_profiler on a Mac takes a few seconds


@dataclass
class Connected:
    target: Target
    transport: Transport
    python: str

    async def run(self, argv: list[str]) -> Completed:
        return await self.transport.run(argv, timeout=COMMAND_TIMEOUT_S)

    async def keyed(self, _key: str, argv: list[str]) -> Completed:
        return await self.run(argv)


@contextlib.asynccontextmanager
async def connected(targets: list[Target], names: list[str],
                    access: Access) -> AsyncIterator[list[Connected]]:
    """Every host at once; every one that cannot be reached is reported, not just the first."""
    hosts = [_connection(t, n, access) for t, n in zip(targets, names, strict=True)]
    results = await asyncio.gather(*(h.transport.connect() for h in hosts),
                                   return_exceptions=True)
    try:
        failed = [f"{h.target.ssh}: {r}" for h, r in zip(hosts, results, strict=True)
                  if isinstance(r, BaseException)]
        if failed:
            raise InitError("cannot probe " + "; ".join(failed))
        yield hosts
    finally:
        await asyncio.gather(*(h.transport.close() for h in hosts), return_exceptions=True)


def _connection(target: Target, name: str, access: Access) -> Connected:
    node = NodeSpec(
        name=name, transport="local" if target.local else "ssh",
        ssh=None if target.local else target.ssh, ssh_port=target.port,
        identity_file=access.identity_file, known_hosts=access.known_hosts,
        accept_new_host_keys=access.accept_new_host_keys,
    )
    python = access.python or (sys.executable if target.local else "python3")
    return Connected(target, transport_for(node), python)


async def probe_all(hosts: list[Connected]) -> list[HostProbe]:
    """Every host's tools, then the neighbour probe for cables with no address."""
    probes = await asyncio.gather(*(probe_host(h.target.ssh, h.keyed, h.python)
                                    for h in hosts))
    for probe, host in zip(probes, hosts, strict=True):
        probe.ssh_port = host.target.port
    runners: list[Runner] = [h.keyed for h in hosts]
    await find_neighbours(list(probes), runners, [h.python for h in hosts])
    return list(probes)
