"""`orchestrator linktest` on local ranks: figures for every link, thresholds, refusal."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from orchestrator.state_file import ClusterState, own_start_time, write_state
from testkit.orchestrator_process import run_cli, write_cluster

pytestmark = pytest.mark.timeout(180)
TWO_LOCAL = [{"name": "a", "ip": "127.0.0.1"}, {"name": "b", "ip": "127.0.0.1"}]


def test_linktest_reports_every_link(tmp_path: Path) -> None:
    """Two local ranks: the sums are correct and each direction of the ring has a figure."""
    config = write_cluster(tmp_path, "bundled:smollm2-135m-instruct", TWO_LOCAL)
    result = run_cli("linktest", str(config), "--json", timeout=150)
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout)
    assert report["correct"] and report["passed"] and report["ranks"] == 2
    assert [(link["from"], link["to"]) for link in report["links"]] == [("a", "b"), ("b", "a")]
    assert all(link["gbs"] > 0 for link in report["links"])
    assert [row["bytes"] for row in report["bandwidth"]][-1] == 64 << 20
    assert 0 < report["latency"]["p50_us"] <= report["latency"]["p99_us"]


def test_linktest_fails_below_min_gbps(tmp_path: Path) -> None:
    """A threshold no link reaches makes the test fail (exit 1) and says which links."""
    config = write_cluster(tmp_path, "bundled:smollm2-135m-instruct", TWO_LOCAL)
    result = run_cli("linktest", str(config), "--min-gbps", "1000000", timeout=150)
    assert result.returncode == 1, result.stdout + result.stderr
    assert result.stdout.count("below 1e+06 Gbit/s") == 2


def test_linktest_refused_while_serving(tmp_path: Path) -> None:
    """While the state file names a live orchestrator, linktest refuses unless --force."""
    config = write_cluster(tmp_path, "bundled:smollm2-135m-instruct", TWO_LOCAL)
    # This test's own process stands in for the running orchestrator: pid and start time.
    state = ClusterState(
        cluster="test",
        config=str(config),
        orchestrator_pid=os.getpid(),
        orchestrator_started=own_start_time(),
        api_url="http://127.0.0.1:9",
    )
    write_state(tmp_path / "state" / "test.toml", state)
    result = run_cli("linktest", str(config), timeout=60)
    assert result.returncode == 2
    assert "is serving" in result.stdout and "--force" in result.stdout
