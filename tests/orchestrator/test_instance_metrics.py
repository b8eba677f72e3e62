"""Every instance's metrics in one scrape, each series labelled model_instance."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from orchestrator.instance_metrics import labelled_text, merge_registries


def _registry(value: float) -> CollectorRegistry:
    registry = CollectorRegistry()
    Counter("orchestrator_restarts", "Restarts.", ["cause"], registry=registry).labels(
        cause="oom").inc(value)
    return registry


def test_registries_merge_into_one_family_labelled_per_instance() -> None:
    """Two instances' counters: one family, a series each with model_instance."""
    text = generate_latest(merge_registries({"a": _registry(1), "b": _registry(2)})).decode()
    assert text.count("# TYPE orchestrator_restarts_total counter") == 1
    families = list(text_string_to_metric_families(text))
    totals = {s.labels["model_instance"]: s.value for f in families for s in f.samples
              if s.name == "orchestrator_restarts_total"}
    assert totals == {"a": 1.0, "b": 2.0}


def test_rank0_texts_are_labelled_and_merged() -> None:
    """Rank 0 texts of two instances (one not ready: empty) become one labelled text."""
    text = labelled_text({"a": generate_latest(_registry(3)), "b": b""}).decode()
    assert 'orchestrator_restarts_total{cause="oom",model_instance="a"} 3.0' in text
    assert 'model_instance="b"' not in text
