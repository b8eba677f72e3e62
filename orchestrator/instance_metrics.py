"""Every instance's metrics in one scrape, each series labelled with its instance.

Each instance has its own OrchestratorMetrics (its own registry: nothing shared between
supervisors); /metrics serves them merged, family by family, with the label
`model_instance` added. Not `instance`: Prometheus sets that one itself (the scrape
target), and would rename ours to `exported_instance`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

LABEL = "model_instance"


class _Merged(Collector):
    def __init__(self, registries: Mapping[str, CollectorRegistry]) -> None:
        self.registries = registries

    def collect(self) -> Iterator[Metric]:
        families: dict[str, Metric] = {}
        for name, registry in self.registries.items():
            for family in registry.collect():
                merged = families.get(family.name)
                if merged is None:
                    merged = families[family.name] = Metric(
                        family.name, family.documentation, family.type, family.unit)
                merged.samples += [
                    sample._replace(labels={**sample.labels, LABEL: name})
                    for sample in family.samples
                ]
        yield from families.values()


def merge_registries(registries: Mapping[str, CollectorRegistry]) -> CollectorRegistry:
    """One registry rendering all of `registries` (by instance name), labelled."""
    merged = CollectorRegistry(auto_describe=False)
    merged.register(_Merged(registries))
    return merged
