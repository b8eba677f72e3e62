"""The alert rules docs/prometheus/alerts.yml ships, run by Prometheus's own rule tester
(`promtool test rules`) on made-up series: each threshold and `for:` duration as
docs/operations.md describes them, just under and just over."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

from testkit import require
from testkit.require import missing

RULES = Path(__file__).parents[3] / "docs" / "prometheus" / "alerts.yml"


def _alert(name: str, **labels: str) -> dict[str, Any]:
    """The alert `name` firing with these series labels, and the rule's own labels and
    annotations (read from the file, one `key: "text"` a line: no YAML dependency)."""
    block = RULES.read_text().split(f"- alert: {name}\n", 1)[1].split("- alert: ", 1)[0]
    severity = re.search(r"labels: \{severity: (\w+)\}", block)
    assert severity is not None, block
    notes = dict(re.findall(r'^\s+(summary|description): "(.*)"$', block, re.MULTILINE))
    return {"exp_labels": {"severity": severity.group(1), **labels},
            "exp_annotations": {k: v.replace("{{ $labels.node }}", labels.get("node", ""))
                                for k, v in notes.items()}}


def _case(series: dict[str, str], checks: list[tuple[str, str, list[dict[str, Any]]]]
          ) -> dict[str, Any]:
    return {
        "interval": "1m",
        "input_series": [{"series": s, "values": v} for s, v in series.items()],
        "alert_rule_test": [{"eval_time": t, "alertname": name, "exp_alerts": alerts}
                            for t, name, alerts in checks],
    }


READY = 'orchestrator_state{orchestrator_state="ready"}'
RESTARTS = 'orchestrator_restarts_total{cause="rank_crashed"}'
AVAILABLE = 'orchestrator_node_memory_bytes{kind="available",node="b"}'
TOTAL = 'orchestrator_node_memory_bytes{kind="total",node="b"}'
AGE = 'orchestrator_node_usage_age_seconds{node="b"}'
UP = 'up{job="mlx-cluster",instance="127.0.0.1:8000"}'


def _of(series: str, instance: str) -> str:
    """`series` as instance `instance`'s registry serves it ([[instances]])."""
    return series.replace("}", f',model_instance="{instance}"}}')


def _tests() -> list[dict[str, Any]]:
    not_ready, restart_loop = _alert("ClusterNotReady"), _alert("RestartLoop")
    low = _alert("NodeMemoryLow", node="b")  # the comparison drops `kind`
    silent = _alert("NodeSilent", node="b")
    down = _alert("OrchestratorDown", job="mlx-cluster", instance="127.0.0.1:8000")
    absent = _alert("OrchestratorMetricsAbsent")
    return [
        # The orchestrator gone: its target down for over a minute fires; up does not.
        _case({UP: "0x10"}, [("0m", "OrchestratorDown", []),
                             ("2m", "OrchestratorDown", [down])]),
        _case({UP: "1x10"}, [("5m", "OrchestratorDown", [])]),
        # No orchestrator_state at all (never started, or no scrape job) for 5 minutes
        # fires; present (whatever its value) does not.
        _case({UP: "0x10"}, [("3m", "OrchestratorMetricsAbsent", []),
                             ("6m", "OrchestratorMetricsAbsent", [absent])]),
        _case({READY: "0x10"}, [("6m", "OrchestratorMetricsAbsent", [])]),
        # Not ready: pending for its first 2 minutes, firing after; ready: never.
        _case({READY: "0x10"}, [("1m", "ClusterNotReady", []),
                                ("3m", "ClusterNotReady", [not_ready])]),
        _case({READY: "1x10"}, [("5m", "ClusterNotReady", [])]),
        # 5 restarts within 10 minutes fire at once (no `for:`); 2 do not.
        _case({RESTARTS: "0 0 0 1 2 3 4 5 5 5 5"}, [("8m", "RestartLoop", [restart_loop])]),
        _case({RESTARTS: "0 0 0 1 2 2 2 2 2 2 2"}, [("8m", "RestartLoop", [])]),
        # 5% available for 3 minutes: pending at 1 minute, firing at 3; 15%: never.
        _case({AVAILABLE: "5x10", TOTAL: "100x10"},
              [("1m", "NodeMemoryLow", []), ("3m", "NodeMemoryLow", [low])]),
        _case({AVAILABLE: "15x10", TOTAL: "100x10"}, [("5m", "NodeMemoryLow", [])]),
        # A node shared by two instances (each reports it, labelled): one alert, by node.
        _case({_of(AVAILABLE, "x"): "5x10", _of(TOTAL, "x"): "100x10",
               _of(AVAILABLE, "y"): "5x10", _of(TOTAL, "y"): "100x10"},
              [("3m", "NodeMemoryLow", [low])]),
        # An agent silent for 31 s fires at once; 29 s does not.
        _case({AGE: "31x3"}, [("0m", "NodeSilent", [silent])]),
        _case({AGE: "29x3"}, [("2m", "NodeSilent", [])]),
    ]


def test_the_alert_rules_fire_at_their_thresholds_and_durations(tmp_path: Path) -> None:
    """promtool runs the shipped rules against series just under and over each threshold,
    before and after each `for:` (the test file is JSON, which promtool reads as YAML)."""
    promtool = shutil.which("promtool")
    if promtool is None:
        missing("promtool is missing (apt-get install prometheus)", require.PROMETHEUS)
    shutil.copy(RULES, tmp_path / "alerts.yml")
    (tmp_path / "tests.yml").write_text(json.dumps({
        "rule_files": ["alerts.yml"], "evaluation_interval": "1m", "tests": _tests()}))
    result = subprocess.run([promtool, "test", "rules", "tests.yml"], cwd=tmp_path,
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
