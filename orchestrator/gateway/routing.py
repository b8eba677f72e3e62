"""Routing by model: which instance's rank 0 a request goes to.

A request names its model (an id or an alias); the instances serving it are replicas.
Among them it goes to the READY replica with the least work the gateway knows of: the
requests it has at that replica (running and waiting there), counted by the gateway's own
proxy. A replica that is restarting or waiting for a node is skipped; the proxy resends a
request that got no token yet, and `not_launch` (the launch that lost it) steers the
resend to another replica when one is ready (orchestrator/gateway/proxy.py).

`ModelRoute` is a `ClusterView` (orchestrator/gateway/view.py) over its replicas, so the
proxy's waits, resends and quarantine work unchanged across replicas.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import msgspec

from contract.openai_errors import ApiError
from orchestrator.gateway.booking import Launches
from orchestrator.gateway.view import ClusterView
from orchestrator.supervision.failures import RankFailure
from orchestrator.supervision.metrics import GatewayCounters
from orchestrator.supervision.snapshot import Upstream
from orchestrator.supervision.state import GangState


@dataclass
class Replica:
    name: str  # the instance's name
    view: ClusterView
    counters: GatewayCounters | None = None  # its metrics, the gateway's requests booked there


class ModelRoute:
    """The replicas of one model: ready while any is."""

    def __init__(self, model_id: str, replicas: list[Replica]) -> None:
        self.model_id, self.replicas = model_id, replicas
        self.in_flight: Counter[str] = Counter()  # by launch id: the proxy's requests there
        self._last: Replica | None = None  # the replica chosen last, for wake_workers
        self._launches: Launches[Replica] = Launches()  # the replica each launch id was at

    def counters_of(self, launch_id: str) -> GatewayCounters | None:
        """The counters of the replica `launch_id` ran on; unknown (or ""): the first
        replica's (orchestrator/gateway/booking.py)."""
        replica = self._launches.get(launch_id)
        if replica is not None and replica.counters is not None:
            return replica.counters
        return next((r.counters for r in self.replicas if r.counters is not None), None)

    def books(self, fallback: GatewayCounters) -> Callable[[str], GatewayCounters]:
        """A launch id's counters for the proxy (`fallback`: replicas without any)."""
        return lambda launch: self.counters_of(launch) or fallback

    async def failure_of(self, launch_id: str, timeout_s: float) -> RankFailure | None:
        """The failure of `launch_id`, as its replica's supervisor saw it first."""
        replica = self._launches.get(launch_id)
        return None if replica is None else await replica.view.failure_of(launch_id, timeout_s)

    @property
    def state(self) -> GangState:
        states = [replica.view.state for replica in self.replicas]
        return GangState.READY if GangState.READY in states else states[0]

    @property
    def reason(self) -> str:
        if len(self.replicas) == 1:
            return self.replicas[0].view.reason
        return "; ".join(f"{r.name}: {r.view.state.value}" + (f" ({r.view.reason})"
                         if r.view.reason else "") for r in self.replicas)

    @property
    def draining(self) -> bool:
        return all(replica.view.draining for replica in self.replicas)

    def wake_workers(self) -> None:
        if self._last is not None:
            self._last.view.wake_workers()

    async def wait_for_upstream(self, timeout_s: float, not_launch: str = "") -> Upstream | None:
        """The least-busy ready replica's rank 0 (other than `not_launch`), waiting for one
        to be ready up to the timeout."""
        deadline = time.monotonic() + timeout_s
        while True:
            chosen = await self._least_busy(not_launch)
            if chosen is not None:
                return chosen
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not await self._any_ready(remaining, not_launch):
                return None

    async def _least_busy(self, not_launch: str) -> Upstream | None:
        best: tuple[int, int, Replica, Upstream] | None = None
        for order, replica in enumerate(self.replicas):
            if replica.view.state != GangState.READY:
                continue
            upstream = await replica.view.wait_for_upstream(0.0, not_launch)
            if upstream is None:
                continue
            load = (self.in_flight[upstream.launch_id], order)
            if best is None or load < best[:2]:
                best = (*load, replica, upstream)
        if best is None:
            return None
        self._last = best[2]
        self._launches.note(best[3].launch_id, best[2])
        return best[3]

    async def _any_ready(self, timeout_s: float, not_launch: str) -> bool:
        """Wait until some replica is ready; False when none will be within the timeout."""
        waits = [asyncio.ensure_future(r.view.wait_for_upstream(timeout_s, not_launch))
                 for r in self.replicas]
        try:
            pending = set(waits)
            while pending:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                if any(task.result() is not None for task in done):
                    return True
            return False
        finally:
            for task in waits:
                task.cancel()


class _Named(msgspec.Struct):
    model: str | None = None


def model_of(body: bytes) -> str | None:
    """The `model` a request body names; None when it names none or is not JSON (rank 0
    answers malformed bodies with its own 400)."""
    try:
        return msgspec.json.decode(body, type=_Named).model
    except msgspec.DecodeError:
        return None


class ModelRouter:
    """Model id or alias -> its route; each id listed once."""

    def __init__(self, routes: list[ModelRoute], aliases: dict[str, str]) -> None:
        self.routes = {route.model_id: route for route in routes}
        self.aliases = aliases  # alias -> model id

    @property
    def ids(self) -> list[str]:
        return list(self.routes)

    def route(self, model: str | None) -> ModelRoute:
        """The route of `model`; with a single model every request goes to it (rank 0
        checks the name, as it did before there were instances)."""
        if len(self.routes) == 1:
            return next(iter(self.routes.values()))
        found = self.routes.get(self.aliases.get(model or "", model or ""))
        if found is None:
            raise unknown_model(model, self.ids)
        return found


def unknown_model(model: str | None, ids: list[str]) -> ApiError:
    served = ", ".join(ids)
    if model is None:
        return ApiError(400, f"You must provide a model parameter: one of {served}",
                        param="model")
    return ApiError(404, f"The model '{model}' does not exist; this gateway serves: {served}",
                    param="model", code="model_not_found")
