"""Whose counters a request is booked under: the instance whose rank 0 served it.

With [[instances]] every instance has its own `orchestrator_*` registry, served merged
with the label `model_instance` (orchestrator/instance_metrics.py). The gateway books a
request's answer, failure, resends and quarantine under the instance whose rank 0 the
request was sent to last: the replica that answered it, or the one that lost it. A request
routed to a model but never sent to any rank 0 (every replica restarting until the
timeout) is booked under the model's first instance in cluster.toml; one that never got
a model (a 401, an unknown model, a body too large) under the gateway's own counters,
served without the label. With one instance everything is booked under it, as before.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Generic, TypeVar

from orchestrator.supervision.metrics import GatewayCounters

KEPT_LAUNCHES = 64  # launch id -> instance: enough for every launch a request can straddle
T = TypeVar("T")


@dataclass
class Booking:
    """One request's counters; the proxy moves it to each instance it sends the request to."""

    counters: GatewayCounters


class Launches(Generic[T]):
    """What was noted of the last KEPT_LAUNCHES launch ids (their instance)."""

    def __init__(self) -> None:
        self._by_launch: OrderedDict[str, T] = OrderedDict()

    def note(self, launch_id: str, value: T) -> None:
        self._by_launch[launch_id] = value
        self._by_launch.move_to_end(launch_id)
        while len(self._by_launch) > KEPT_LAUNCHES:
            self._by_launch.popitem(last=False)

    def get(self, launch_id: str) -> T | None:
        return self._by_launch.get(launch_id)
