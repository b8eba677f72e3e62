"""What the supervisor publishes: a frozen picture of the cluster for the gateway and status.

Readers get a copy, never the supervisor's live objects, so nothing outside the
supervision loop can change (or half-read) its state.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from orchestrator.launch.gang import LaunchedRank
from orchestrator.supervision.failures import GangResult, RankFailure
from orchestrator.supervision.progress import ServingSample
from orchestrator.supervision.state import GangState


@dataclass(frozen=True)
class Upstream:
    """Rank 0's internal API of one launch of the gang."""

    url: str
    launch_id: str
    secret: str = field(default="", repr=False)  # sent as contract.launch_secret.HEADER
    tls_cert: str = field(default="", repr=False)  # pinned when set (url is https)


@dataclass(frozen=True)
class SupervisorSnapshot:
    state: GangState
    reason: str
    launch_id: str  # "" before the first launch
    ranks: tuple[LaunchedRank, ...]  # copies, in rank order
    restarts: int
    last_failure: RankFailure | None  # root cause of the latest restart
    history: tuple[GangResult, ...]  # recent gang failures, oldest first
    serving: ServingSample | None  # rank 0's latest counters
    tokens_per_second: float
