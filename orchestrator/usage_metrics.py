"""The nodes' live usage as Prometheus metrics, read at scrape time from the latest reports.

A node whose agent has been silent past the stale bound exports no memory figures at all
(only its report's age), so a dashboard shows a gap, not a number that stopped moving.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from orchestrator.transports.pool import NodeConnection


class NodeUsageCollector(Collector):
    def __init__(
        self, nodes: Mapping[str, NodeConnection], clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._nodes, self._clock = nodes, clock

    def collect(self) -> Iterator[GaugeMetricFamily]:
        memory = GaugeMetricFamily(
            "orchestrator_node_memory_bytes",
            "Node memory from its agent's latest report: total, available, held by our "
            "ranks, wired (macOS).",
            labels=["node", "kind"],
        )
        ranks = GaugeMetricFamily(
            "orchestrator_rank_memory_bytes",
            "Resident memory of each rank (its process tree).",
            labels=["node", "rank"],
        )
        load = GaugeMetricFamily(
            "orchestrator_node_load1", "The node's 1-minute load average.", labels=["node"]
        )
        age = GaugeMetricFamily(
            "orchestrator_node_usage_age_seconds",
            "Seconds since the node's agent last reported its usage.",
            labels=["node"],
        )
        now = self._clock()
        for name, node in self._nodes.items():
            if node.usage is not None:
                age.add_metric([name], now - node.usage_at)
            usage = node.fresh_usage(now)
            if usage is None:
                continue
            kinds = {
                "total": usage.memory.total_bytes,
                "available": usage.memory.available_bytes,
                "ranks": sum(r.rss_bytes for r in usage.ranks),
                "wired": usage.wired_bytes,
            }
            for kind, value in kinds.items():
                if value is not None:
                    memory.add_metric([name, kind], value)
            for rank in usage.ranks:
                ranks.add_metric([name, str(rank.rank)], rank.rss_bytes)
            if usage.load_1m is not None:
                load.add_metric([name], usage.load_1m)
        yield from (memory, ranks, load, age)
