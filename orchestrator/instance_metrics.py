"""Every instance's metrics in one scrape, each series labelled with its instance.

Each instance has its own OrchestratorMetrics (its own registry: nothing shared between
supervisors); /metrics serves them merged, family by family, with the label
`model_instance` added. Not `instance`: Prometheus sets that one itself (the scrape
target), and would rename ours to `exported_instance`. A part named "" is served without
the label (the gateway's counters of requests no instance saw).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

LABEL = "model_instance"


class _Merged(Collector):
    def __init__(self, parts: Mapping[str, Callable[[], Iterable[Metric]]]) -> None:
        self.parts = parts  # instance name -> its families

    def collect(self) -> Iterator[Metric]:
        families: dict[str, Metric] = {}
        for name, part in self.parts.items():
            for family in part():
                merged = families.get(family.name)
                if merged is None:
                    merged = families[family.name] = Metric(
                        family.name, family.documentation, family.type, family.unit)
                merged.samples += [
                    sample._replace(labels={**sample.labels, LABEL: name}) if name else sample
                    for sample in family.samples
                ]
        yield from families.values()


def merge_registries(registries: Mapping[str, CollectorRegistry]) -> CollectorRegistry:
    """One registry rendering all of `registries` (by instance name), labelled."""
    merged = CollectorRegistry(auto_describe=False)
    merged.register(_Merged({name: r.collect for name, r in registries.items()}))
    return merged


def labelled_text(texts: Mapping[str, bytes]) -> bytes:
    """Prometheus texts (each instance's rank 0's), merged and labelled as above."""
    def parsed(text: bytes) -> Callable[[], Iterable[Metric]]:
        return lambda: text_string_to_metric_families(text.decode())

    merged = CollectorRegistry(auto_describe=False)
    merged.register(_Merged({name: parsed(text) for name, text in texts.items() if text}))
    return generate_latest(merged)
