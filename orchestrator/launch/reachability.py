"""The links between ranks, checked before each launch and watched while a gang serves.

Before a launch, the node each rank listens on opens that address and port and the node
that will connect to it connects (TCP, seconds, no MLX): a cable that is down, lossy or
wrongly addressed is named at once, instead of an `init_timeout` after launch_timeout_s.
While the gang is ready, the connecting node probes each link every second (see
node_agent/links.py) and reports a link that stops answering.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass

from contract.agent_protocol import LinkTarget
from orchestrator.config import ClusterSpec
from orchestrator.config.links import Hop, hops
from orchestrator.transports import AgentRequestError, TransportError
from orchestrator.transports.pool import NodePool

log = logging.getLogger(__name__)
CONNECT_TIMEOUT_S = 3.0


@dataclass(frozen=True)
class LinkFailure:
    src: str  # node that connects
    dst: str  # node that listens
    address: str  # "ip:port"
    field: str  # where cluster.toml sets the address
    error: str

    def render(self) -> str:
        return f"{self.src:<12} -> {self.dst:<12} {self.address:<22} {self.error}"


LINK_FIX = (
    "check the cable and that each address in the row is configured on the listening "
    "node's interface for that link ({field}); `orchestrator linktest` measures the links"
)


def link_table(failures: list[LinkFailure]) -> str:
    head = f"{'from':<12}    {'to':<12} {'address':<22} error"
    fields = ", ".join(dict.fromkeys(f.field for f in failures))
    rows = "\n".join("  " + failure.render() for failure in failures)
    return f"  {head}\n{rows}\n  fix: {LINK_FIX.format(field=fields)}"


class LinkChecks:
    """Reachability checks and the link watch of one cluster, through its agents."""

    def __init__(self, spec: ClusterSpec, pool: NodePool) -> None:
        self.spec, self.pool = spec, pool
        self.hops = hops(spec)

    def node(self, rank: int) -> str:
        return self.spec.nodes[rank].name

    async def check(self) -> list[LinkFailure]:
        """Every hop a launch will open, tried now; the ones that fail."""
        # One listener per endpoint: with jaccl every rank connects to the coordinator.
        endpoints = {_endpoint(h): h for h in self.hops}
        errors = await self._gather(self._listen, endpoints.values())
        listen_error = dict(zip(endpoints, errors, strict=True))
        try:
            failures = [
                self._failure(endpoints[key], f"cannot listen there: {error}")
                for key, error in listen_error.items()
                if error
            ]
            open_hops = [h for h in self.hops if not listen_error[_endpoint(h)]]
            results = await self._gather(self._connect, open_hops)
            failures += [
                self._failure(h, e) for h, e in zip(open_hops, results, strict=True) if e
            ]
        finally:
            listening = [endpoints[key] for key, error in listen_error.items() if not error]
            await self._gather(self._unlisten, listening)
        return failures

    async def watch(self) -> None:
        """Have each connecting node probe its links (best effort: a lost agent is reported
        on its own)."""
        by_node: dict[str, list[LinkTarget]] = {}
        for hop in self.hops:
            target = LinkTarget(host=hop.address.ip, port=hop.port)
            by_node.setdefault(self.node(hop.src), []).append(target)
        await self._send_watch(by_node)

    async def unwatch(self) -> None:
        await self._send_watch({self.node(hop.src): [] for hop in self.hops})

    async def _send_watch(self, by_node: dict[str, list[LinkTarget]]) -> None:
        """All nodes at once: one that is away must not hold up the others."""

        async def one(name: str, targets: list[LinkTarget]) -> None:
            try:
                await self.pool.agent(name).watch_links(targets)
            except (TransportError, AgentRequestError, TimeoutError) as exc:
                log.warning("[%s] link watch not changed: %s", name, exc)

        await asyncio.gather(*(one(name, targets) for name, targets in by_node.items()))

    async def _listen(self, hop: Hop) -> str | None:
        await self.pool.agent(self.node(hop.dst)).listen(hop.address.ip, hop.port)
        return None

    async def _unlisten(self, hop: Hop) -> str | None:
        await self.pool.agent(self.node(hop.dst)).unlisten(hop.address.ip, hop.port)
        return None

    async def _connect(self, hop: Hop) -> str | None:
        agent = self.pool.agent(self.node(hop.src))
        result = await agent.connect(hop.address.ip, hop.port, CONNECT_TIMEOUT_S)
        return None if result.ok else result.error

    async def _gather(
        self, step: Callable[[Hop], Awaitable[str | None]], todo: Iterable[Hop]
    ) -> list[str | None]:
        """Run `step` on every hop at once; each one's error (None when it worked)."""

        async def one(hop: Hop) -> str | None:
            try:
                return await step(hop)
            except AgentRequestError as exc:
                return exc.message
            except (TransportError, TimeoutError) as exc:
                return f"agent: {exc}"

        return list(await asyncio.gather(*(one(hop) for hop in todo)))

    def _failure(self, hop: Hop, error: str) -> LinkFailure:
        return LinkFailure(
            self.node(hop.src),
            self.node(hop.dst),
            f"{hop.address.ip}:{hop.port}",
            hop.address.field,
            error,
        )


def _endpoint(hop: Hop) -> tuple[int, str, int]:
    return hop.dst, hop.address.ip, hop.port
