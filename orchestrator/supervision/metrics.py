"""The control plane's Prometheus metrics (`orchestrator_*`, base units, `_total` counters).

One registry per orchestrator, so tests and several clusters in one process never share
counters. The gateway's /metrics serves this registry followed by rank 0's `serving_*`.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Enum, Gauge, Histogram, generate_latest

from contract.placement import Placement
from orchestrator.supervision.failures import Cause
from orchestrator.supervision.state import GangState

FAILED_REQUEST_REASONS = ("unavailable", "stream_cut")  # the gateway's labels
PREFLIGHT_CHECKS = (
    "versions", "model", "heads", "architecture", "memory", "address", "ports", "jaccl", "links"
)
STATUSES = ("200", "400", "401", "404", "413", "429", "500", "503", "504")
_DURATION_BUCKETS = (0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600)


class GatewayCounters:
    """What the gateway books per request: answers by status, failures, resends and
    quarantines. Each instance's registry has them (booked under the instance whose rank 0
    the request went to: orchestrator/gateway/booking.py); with [[instances]] the gateway
    also has a set of its own, for requests no instance saw (a 401, an unknown model)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        r = self.registry = registry
        self.requests_retried = Counter(
            "orchestrator_requests_retried",
            "Requests resent to a new gang after a failure.",
            registry=r,
        )
        self.responses = Counter(
            "orchestrator_responses",
            "Answers of the gateway's /v1 routes by HTTP status.",
            ["status"],
            registry=r,
        )
        self.requests_failed = Counter(
            "orchestrator_requests_failed",
            "Requests the gateway ended with an error.",
            ["reason"],
            registry=r,
        )
        self.requests_quarantined = Counter(
            "orchestrator_requests_quarantined",
            "Requests answered with an error because their isolated run crashed the gang.",
            registry=r,
        )
        self.request_of_death_restarts = Counter(
            "orchestrator_request_of_death_restarts",
            "Gang failures with a quarantined request in flight (its batched and its "
            "isolated run: at most 2 per request).",
            registry=r,
        )
        # Every known label value from the start, so increase() and rate() see a 0, not
        # no series, until the first event.
        for reason in FAILED_REQUEST_REASONS:
            self.requests_failed.labels(reason=reason)
        for status in STATUSES:
            self.responses.labels(status=status)


class OrchestratorMetrics(GatewayCounters):
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.state = Enum(
            "orchestrator_state",
            "State of the cluster's gang.",
            states=[state.value for state in GangState],
            registry=r,
        )
        self.restarts = Counter(
            "orchestrator_restarts", "Gang restarts by root cause.", ["cause"], registry=r
        )
        self.node_up = Gauge(
            "orchestrator_node_up", "1 when the node's agent is connected.", ["node"], registry=r
        )
        self.rank_up = Gauge(
            "orchestrator_rank_up", "1 while the rank's process runs.", ["rank"], registry=r
        )
        self.launch_duration = Histogram(
            "orchestrator_launch_duration_seconds",
            "From gang launch to rank 0 ready.",
            buckets=_DURATION_BUCKETS,
            registry=r,
        )
        self.recovery = Histogram(
            "orchestrator_recovery_seconds",
            "From failure detected to ready again.",
            buckets=_DURATION_BUCKETS,
            registry=r,
        )
        self.restart_backoff = Gauge(
            "orchestrator_restart_backoff_seconds",
            "Backoff before the pending relaunch.",
            registry=r,
        )
        self.preflight_failures = Counter(
            "orchestrator_preflight_failures", "Failed preflight checks.", ["check"], registry=r
        )
        super().__init__(r)
        self._placement_metrics(r)
        self.state.state(GangState.PENDING.value)
        self._zero_known_labels()

    def _placement_metrics(self, r: CollectorRegistry) -> None:
        self.rank_layers = Gauge(
            "orchestrator_rank_layers",
            "Pipeline mode: the first (edge=start) and one past the last (edge=end) layer a "
            "rank holds, in the model's numbering.",
            ["rank", "node", "edge"],
            registry=r,
        )
        self.rank_weight_bytes = Gauge(
            "orchestrator_rank_weight_bytes",
            "Bytes of the model's weights a rank holds (its placement's estimate).",
            ["rank", "node"],
            registry=r,
        )
        self.parallel_mode = Enum(
            "orchestrator_parallel_mode",
            "How the model is split over the ranks.",
            states=["tensor", "pipeline"],
            registry=r,
        )

    def show_placement(self, placement: Placement) -> None:
        self.parallel_mode.state(placement.mode)
        for share in placement.ranks:
            labels = {"rank": str(share.rank), "node": share.node}
            self.rank_weight_bytes.labels(**labels).set(share.weight_bytes)
            if share.layers:
                self.rank_layers.labels(**labels, edge="start").set(share.layers[0])
                self.rank_layers.labels(**labels, edge="end").set(share.layers[1])

    def _zero_known_labels(self) -> None:
        """Every known label value from the start, so increase() and rate() see a 0, not
        no series, until the first event."""
        for cause in Cause:
            self.restarts.labels(cause=cause.value)
        for check in PREFLIGHT_CHECKS:
            self.preflight_failures.labels(check=check)

    def expose(self, registry: CollectorRegistry) -> None:
        """Serve `registry` at /metrics instead (every instance's, labelled)."""
        self._exposed = registry

    def render(self) -> bytes:
        return generate_latest(getattr(self, "_exposed", self.registry))
