"""docs/architecture.md's metrics table names every family the Grafana dashboard and the
alert rules query (an operator reading a panel finds what it shows)."""

from __future__ import annotations

import json
import re

from testkit import paths

DOCS = paths.ROOT / "docs"
FAMILY = re.compile(r"\b((?:orchestrator|serving)_[a-z0-9_]+)")
SUFFIX = re.compile(r"_(bucket|sum|count|created)$")


def _table() -> str:
    text = (DOCS / "architecture.md").read_text()
    return text.split("## Metrics", 1)[1].split("\n## ", 1)[0]


def _documented(family: str, table: str) -> bool:
    """Named whole, or as a `_suffix` after its stem in one cell (`x_running`, `_waiting`)."""
    if f"`{family}`" in table:
        return True
    stem, _, tail = family.rpartition("_")
    return any(f"`{stem}_{other}`" in table and f"`_{tail}`" in table
               for other in ("running", "waiting", "pending"))


def test_every_family_the_dashboard_and_alerts_use_is_in_the_table() -> None:
    """Each family in a panel or rule expression (histogram suffixes dropped)."""
    dashboard = json.loads((DOCS / "grafana" / "mlx-cluster.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    exprs.append((DOCS / "prometheus" / "alerts.yml").read_text())
    used = {SUFFIX.sub("", name) for expr in exprs for name in FAMILY.findall(expr)}
    table = _table()
    missing = sorted(f for f in used if not _documented(f, table))
    assert not missing, f"add to docs/architecture.md's metrics table: {missing}"
