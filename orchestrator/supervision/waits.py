"""The supervisor's waits between gangs, shown as state `waiting`: for the links between
ranks to answer, and for nodes that are away (a Mac asleep) to come back. Neither spends
a restart; past node_wait_s the gang serves on the nodes that remain (fewer_nodes.py) or
the cluster fails with the reason.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from orchestrator.supervision.failures import Cause, RankFailure
from orchestrator.supervision.fewer_nodes import KeepWaiting, Shrink
from orchestrator.supervision.interfaces import Answers, Links
from orchestrator.supervision.metrics import OrchestratorMetrics
from orchestrator.supervision.node_wait import NodeWait
from orchestrator.supervision.recovery import Fail
from orchestrator.supervision.state import GangState, StateMachine

log = logging.getLogger(__name__)

LINK_RETRY_S = 1.0  # between reachability checks while a link is down
NODE_RETRY_S = 2.0  # between attempts to reach a node that is away


class Waits:
    def __init__(
        self,
        node_wait_s: float,
        machine: StateMachine,
        metrics: OrchestratorMetrics,
        links: Links | None,
        answers: Answers,
        clock: Callable[[], float],
        pause: Callable[[float], Awaitable[bool]],  # sleep; True when a stop came first
    ) -> None:
        self.node_wait_s, self.machine, self.metrics = node_wait_s, machine, metrics
        self._links, self.answers, self._clock, self._pause = links, answers, clock, pause

    async def links(self) -> list[RankFailure] | None:
        """Until every link between ranks answers ([]), a node at either end of a dead one
        does not (its failure: that node is waited for instead), or a stop request (None):
        a gang launched over a dead cable would only hang in its ring set-up."""
        counted = False
        while self._links is not None:
            failures = await self._links.check()
            if not failures:
                break
            ends = list(dict.fromkeys(name for f in failures for name in (f.src, f.dst)))
            away = await self.answers.away(ends)
            if away:
                return [
                    RankFailure(Cause.AGENT_LOST, name, None, error, self._clock())
                    for name, error in away.items()
                ]
            if not counted:  # the relaunch's own preflight: one count per relaunch and link
                self.metrics.preflight_failures.labels(check="links").inc(len(failures))
                counted = True
            waiting = "; ".join(f"{f.src} -> {f.dst} {f.address}: {f.error}" for f in failures)
            self.machine.to(GangState.WAITING, f"waiting for links: {waiting}")
            if await self._pause(LINK_RETRY_S):
                return None
        if self.machine.state == GangState.WAITING:
            self.machine.to(GangState.LAUNCHING, "every link answers again")
        return []

    async def nodes(
        self,
        names: list[str],
        away: dict[str, str],
        since: float,
        decide: Callable[[NodeWait], KeepWaiting | Shrink | Fail],
    ) -> str | Shrink | None:
        """Until every node answers again ("": relaunch now), `decide` (fewer_nodes.
        decide_away) says to serve on the rest (a Shrink) or to fail (the reason, once past
        node_wait_s), or a stop request (None). `since`: when the failure that revealed
        them was noticed."""
        wait = NodeWait(self.node_wait_s, self._clock)
        while away:
            if away.keys() != wait.since.keys():
                log.warning("unreachable: %s", "; ".join(f"{n}: {e}" for n, e in away.items()))
            wait.update(away, since if not wait.waiting else None)
            for name in away:
                self.metrics.node_up.labels(node=name).set(0)
            match decide(wait):
                case Fail(reason):
                    return reason
                case Shrink() as shrink:
                    return shrink
                case KeepWaiting(reason):
                    self.machine.to(GangState.WAITING, reason)
            if await self._pause(NODE_RETRY_S):
                return None
            away = await self.answers.away(names)
        log.info("every node answers again: relaunching at once, no restart spent")
        return ""
