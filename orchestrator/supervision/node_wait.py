"""Nodes that went away (a Mac asleep, unplugged, rebooting): found, and waited for.

A failed reconnect is no reason to spend a restart: the node is not broken, it is gone for
a while. After a gang fails, every node is asked to answer (its agent's ping, or a fresh
connection); the ones that cannot be reached are waited for, up to `node_wait_s`, and the
gang is relaunched as soon as all answer again. Only the kinds of error a sleeping or
rebooting Mac gives count as away: a refused key or a missing python is a fault waiting
cannot fix, and goes the ordinary way (a restart, or failed).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from orchestrator.transports import ErrorKind, TransportError
from orchestrator.transports.pool import NodePool

# Name not resolving (a sleeping Mac's .local name), nothing listening yet (booting),
# no route, no answer, or the connection dropped: what a node that is away looks like.
AWAY_KINDS = frozenset(
    {ErrorKind.DNS, ErrorKind.REFUSED, ErrorKind.UNREACHABLE, ErrorKind.TIMEOUT,
     ErrorKind.AGENT_LOST}
)
# A connected agent answers a ping in milliseconds; one that does not within PING_S is taken
# as away (a mistake costs only a retry NODE_RETRY_S later, no restart).
PING_S = 3.0
CONNECT_S = 20.0  # bounds one reconnect (SSH connect, deploy check, agent start)


class NodeAnswers:
    """Asks each node to answer, through the pool's agents (a fake in unit tests)."""

    def __init__(self, pool: NodePool) -> None:
        self.pool = pool

    async def away(self, names: list[str]) -> dict[str, str]:
        """The nodes among `names` that cannot be reached now, each with why."""
        errors = await asyncio.gather(*(self._error(name) for name in names))
        return {name: error for name, error in zip(names, errors, strict=True) if error}

    async def _error(self, name: str) -> str | None:
        if self.pool.nodes[name].connected:
            try:
                await self.pool.agent(name).ping(PING_S)
                return None
            except TimeoutError:
                # Its handle drops it once the lease passes; reconnecting now would only
                # wait on the old connection's close.
                return f"its agent did not answer within {PING_S:g} s"
            except TransportError:
                pass  # lost just now: reconnect below
        try:
            await asyncio.wait_for(self.pool.connect(name), CONNECT_S)
        except TimeoutError:
            return f"no connection within {CONNECT_S:g} s"
        except TransportError as exc:
            return f"{exc.kind}: {exc.message}" if exc.kind in AWAY_KINDS else None
        return None


@dataclass
class NodeWait:
    """The nodes being waited for: since when each is away, and the reason to show."""

    limit_s: float
    clock: Callable[[], float]
    wall: Callable[[], float] = time.time
    since: dict[str, float] = field(default_factory=dict)  # node -> first seen away
    since_wall: dict[str, str] = field(default_factory=dict)  # the same, as a time of day
    errors: dict[str, str] = field(default_factory=dict)  # node -> latest error

    def update(self, away: dict[str, str], since: float | None = None) -> None:
        """The nodes away now; a node newly away counts from `since` (the failure that
        revealed it, on the monotonic clock), else from now."""
        now = self.clock()
        at = now if since is None else min(since, now)
        today = time.strftime("%H:%M:%S", time.localtime(self.wall() - (now - at)))
        self.since = {name: self.since.get(name, at) for name in away}
        self.since_wall = {name: self.since_wall.get(name, today) for name in away}
        self.errors = dict(away)

    @property
    def waiting(self) -> bool:
        return bool(self.since)

    def overdue(self) -> bool:
        """True once a node has been away longer than node_wait_s."""
        return any(self.clock() - at >= self.limit_s for at in self.since.values())

    def reason(self) -> str:
        """`waiting for node b: unreachable since 12:03:04 (timeout: no answer ...)`."""
        parts = [
            f"{name}: unreachable since {self.since_wall[name]} ({self.errors[name]})"
            for name in self.since
        ]
        plural = "s" if len(parts) > 1 else ""
        return f"waiting for node{plural} " + "; ".join(parts)

    def failed_reason(self) -> str:
        names = ", ".join(self.since)
        first = self.since_wall[min(self.since, key=self.since.__getitem__)]
        errors = "; ".join(f"{name}: {self.errors[name]}" for name in self.since)
        return (
            f"node {names} unreachable since {first}, longer than "
            f"node_wait_s ({self.limit_s:g} s): {errors}. Wake or reconnect it (and keep "
            "cluster Macs from sleeping, docs/mac-setup.md), then `orchestrator restart`"
        )

