"""Serving on with fewer Macs: a node away past node_wait_s, the gang re-planned on the
nodes that remain; the full placement back once the node answers again.

    node away ── node_wait_s ──▶ the model fits the rest? ── yes ──▶ Shrink: serve on them
                                      │ no: fail as before, saying why     │ it answers again
                                      │ lacking files: keep waiting        ▼
                                                          planned switch: every node again

`decide_away` is the pure decision (its clock is the NodeWait's); `FewerNodes` holds the
re-plan in force and watches for the nodes' return. `[supervisor] serve_on_fewer_nodes =
false` keeps the old behaviour: failed once a node is away past node_wait_s.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Collection, Mapping
from dataclasses import dataclass

from contract.adoption import LaunchRecord
from contract.fingerprint import NodeFingerprint
from contract.placement import Placement
from orchestrator.config import ClusterSpec
from orchestrator.launch.adoption import left_out
from orchestrator.launch.gang import Gang
from orchestrator.placement.remaining import NotPlaced, place_remaining, without
from orchestrator.state_file import RankRecord
from orchestrator.supervision.interfaces import Answers
from orchestrator.supervision.node_wait import NodeWait
from orchestrator.supervision.recovery import Fail


@dataclass(frozen=True)
class KeepWaiting:
    """Wait on for the nodes away (state `waiting`, with this reason)."""

    reason: str


@dataclass(frozen=True)
class Shrink:
    """Serve on the nodes that remain: the gang of `spec` (cluster.toml's less `away`)."""

    spec: ClusterSpec
    placement: Placement | None
    away: tuple[str, ...]
    reason: str  # for the state's reason while it serves

    @property
    def nodes(self) -> list[str]:
        return [node.name for node in self.spec.nodes]


def decide_away(
    wait: NodeWait,
    spec: ClusterSpec,
    prints: Mapping[str, NodeFingerprint],
    enabled: bool,
    already_away: Collection[str] = (),
) -> KeepWaiting | Shrink | Fail:
    """What to do while `wait`'s nodes are away: wait until node_wait_s passes; then serve
    on the rest if `enabled` and the model fits them, else fail saying why (or wait on
    while the rest only lack model files). `already_away`: the nodes the gang serves
    without already (a re-plan in force)."""
    if not wait.overdue():
        return KeepWaiting(wait.reason())
    away = tuple(dict.fromkeys([*already_away, *wait.since]))
    if not enabled or len(away) >= len(spec.nodes):
        return Fail(wait.failed_reason())
    remaining = place_remaining(spec, prints, away)
    if isinstance(remaining, NotPlaced):
        names = ", ".join(node.name for node in spec.nodes if node.name not in away)
        why = f"the model cannot be served on the rest ({names or 'none'}): {remaining.reason}"
        if remaining.lacking_files:
            return KeepWaiting(f"{wait.reason()}; past node_wait_s, {why}")
        return Fail(f"{wait.failed_reason()}; {why}")
    fewer, placement = remaining.spec, remaining.placement
    shape = f"{placement.mode} ({placement.reason})" if placement else "placement not decided"
    without = ", ".join(f"{name} (away since {wait.since_wall.get(name, 'earlier')})"
                        for name in away)
    reason = (f"on {len(fewer.nodes)} of {len(spec.nodes)} nodes, without {without}: {shape}; "
              "every node again once it answers")
    return Shrink(fewer, placement, away, reason)


def adopted_shrink(spec: ClusterSpec, record: LaunchRecord) -> Shrink | None:
    """The re-plan an adopted gang serves when its record names fewer nodes than `spec`
    (a previous orchestrator re-planned it, then exited): the supervisor serves it as its
    own re-plan, and returns to every node once the others answer. None: every node."""
    away = tuple(left_out(spec, record))
    if not away:
        return None
    placement = record.placement
    shape = f"{placement.mode} ({placement.reason})" if placement else "placement not decided"
    reason = (f"on {len(record.nodes)} of {len(spec.nodes)} nodes, without {', '.join(away)} "
              f"(adopted launch {record.launch_id}): {shape}; every node again once it answers")
    return Shrink(without(spec, away), placement, away, reason)


class FewerNodes:
    """The re-plan in force (None: every node), and the watch for its nodes' return."""

    def __init__(
        self,
        spec: ClusterSpec,
        fewer_gang: Callable[[Shrink], Gang] | None,  # None: no gang on fewer nodes (off)
        answers: Answers,
        sleep: Callable[[float], Awaitable[None]],
        retry_s: float,
    ) -> None:
        self.spec, self._fewer_gang = spec, fewer_gang
        self.enabled = spec.supervisor.serve_on_fewer_nodes and fewer_gang is not None
        self._answers, self._sleep, self._retry_s = answers, sleep, retry_s
        self.current: Shrink | None = None
        self.back = False  # every node away answers again: time for the planned switch
        self.on_change: Callable[[], None] = lambda: None  # the shape of the next gang changed
        self._watch: asyncio.Task[None] | None = None
        self._left: list[RankRecord] = []  # unconfirmed ranks on the nodes away

    def gang_maker(self, new_gang: Callable[[], Gang]) -> Callable[[], Gang]:
        """Makes the next gang: on every node, or on those of the re-plan in force."""
        def make() -> Gang:
            if self.current is not None and self._fewer_gang is not None:
                return self._fewer_gang(self.current)
            return new_gang()
        return make

    def decider(
        self, prints: Callable[[], Mapping[str, NodeFingerprint]]
    ) -> Callable[[NodeWait], KeepWaiting | Shrink | Fail]:
        """decide_away for Waits.nodes, with the nodes' latest fingerprints."""
        return lambda wait: decide_away(wait, self.spec, prints(), self.enabled, self.away)

    def nodes(self, every: list[str]) -> list[str]:
        """The nodes the gang runs on now."""
        return self.current.nodes if self.current else every

    @property
    def away(self) -> tuple[str, ...]:
        return self.current.away if self.current else ()

    @property
    def back_reason(self) -> str:
        return (f"{', '.join(self.away)} answers again: back to every node (a planned "
                "switch: no restart spent, requests held meanwhile)")

    def shrink(self, shrink: Shrink) -> None:
        self.current, self.back = shrink, False
        self.on_change()

    def stale(self, last: Gang | None) -> list[RankRecord]:
        """Ranks to reap by PID before the next launch: those of `last` whose stop no
        agent confirmed, except on the nodes away (kept, and reaped once they are back)."""
        records, away = (last.unconfirmed() if last else []) + self._left, set(self.away)
        self._left = [record for record in records if record.node in away]
        return [record for record in records if record.node not in away]

    def restore(self) -> None:
        self.current, self.back = None, False
        self.on_change()

    def watch_for_return(self) -> None:
        """While a re-plan serves: ask its nodes away every retry_s until all answer."""
        if self.current is not None and (self._watch is None or self._watch.done()):
            self._watch = asyncio.ensure_future(self._until_back(list(self.current.away)))

    async def unwatch(self) -> None:
        if self._watch is not None:
            self._watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watch
            self._watch = None

    async def _until_back(self, names: list[str]) -> None:
        while await self._answers.away(names):
            await self._sleep(self._retry_s)
        self.back = True
