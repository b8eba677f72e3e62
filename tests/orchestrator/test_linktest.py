"""`orchestrator linktest` on local ranks: figures for every link, thresholds, refusal; on
a ring of namespace hosts (built once for the two tests that use it, each leaving its
cables clear): a shaped cable measured, a dead one named."""

from __future__ import annotations

import json
import os
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest
import tomli_w

from contract.linktest import BandwidthRow, Latency, LinkFigure, LinktestResult
from orchestrator.config import check_cluster_file
from orchestrator.linktest import LinkReport
from orchestrator.state_file import ClusterState, own_start_time, write_state
from testkit.netns import MultiHost
from testkit.orchestrator_process import run_cli, write_cluster
from testkit.shared_hosts import shared_hosts

pytestmark = pytest.mark.timeout(180)
TWO_LOCAL = [{"name": "a", "ip": "127.0.0.1"}, {"name": "b", "ip": "127.0.0.1"}]


@pytest.mark.e2e
def test_linktest_reports_every_link_and_fails_below_min_gbps(tmp_path: Path) -> None:
    """Two local ranks: the sums are correct and each direction of the ring has a figure;
    a threshold no link reaches fails the test (exit 1) and says which links. (One run:
    the table's wording of a slow link is checked on a fixed result below.)"""
    config = write_cluster(tmp_path, "bundled:smollm2-135m-instruct", TWO_LOCAL)
    result = run_cli("linktest", str(config), "--json", "--min-gbps", "1000000", timeout=150)
    assert result.returncode == 1, result.stdout + result.stderr
    report = json.loads(result.stdout)
    assert report["correct"] and not report["passed"] and report["ranks"] == 2
    assert report["min_gbps"] == 1e6
    assert [(link["from"], link["to"]) for link in report["links"]] == [("a", "b"), ("b", "a")]
    assert all(link["gbs"] > 0 and not link["ok"] for link in report["links"])
    assert [row["bytes"] for row in report["bandwidth"]][-1] == 64 << 20
    assert 0 < report["latency"]["p50_us"] <= report["latency"]["p99_us"]


def test_the_table_says_which_links_are_below_min_gbps(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The printed report marks each link below --min-gbps with the threshold, the others
    ok; it fails only then."""
    spec, _ = check_cluster_file(
        write_cluster(tmp_path, "bundled:smollm2-135m-instruct", TWO_LOCAL))
    result = LinktestResult(
        ranks=2, correct=True, latency=Latency(p50_us=50.0, p99_us=90.0),
        bandwidth=[BandwidthRow(64 << 20, 0.1, 0.67, 0.67)],
        links=[LinkFigure(0, 1, 8 << 20, 0.01, 0.84), LinkFigure(1, 0, 8 << 20, 0.1, 0.084)],
    )
    for min_gbps, below in ((1e6, 2), (1.0, 1), (0.5, 0)):
        report = LinkReport(spec, result, min_gbps)
        report.print()
        out = capsys.readouterr().out
        assert out.count(f"below {min_gbps:g} Gbit/s") == below, out
        assert out.count(" ok") >= 2 - below and report.passed == (below == 0), out


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


@pytest.fixture(scope="module")
def ring(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MultiHost]:
    """3 hosts cabled in a ring, shared by the ring tests (a set of hosts costs its
    namespaces, veths and an sshd per host to build and tear down)."""
    with shared_hosts(tmp_path_factory, 3, "ring") as net:
        yield net


def ring_config(tmp_path: Path, net: MultiHost) -> Path:
    config = write_cluster(
        tmp_path, "bundled:smollm2-135m-instruct", [net.node(i) for i in (0, 1, 2)]
    )
    data = tomllib.loads(config.read_text())
    data["links"] = net.links()
    config.write_text(tomli_w.dumps(data))
    return config


@pytest.mark.e2e
def test_linktest_sees_the_shaped_cable(ring: MultiHost, tmp_path: Path) -> None:
    """A ring of 3 hosts with the h0-h1 cable shaped to 200 Mbit/s: that link measures below
    0.25 Gbit/s, the others several times more."""
    net = ring
    net.shape(0, 1, rate="200mbit")
    try:
        result = run_cli("linktest", str(ring_config(tmp_path, net)), "--json", timeout=170)
    finally:
        net.clear(0, 1)
    assert result.returncode == 0, result.stdout + result.stderr
    gbits = {
        (link["from"], link["to"]): link["gbits"] for link in json.loads(result.stdout)["links"]
    }
    assert gbits[("h0", "h1")] < 0.25, gbits
    assert min(gbits[("h1", "h2")], gbits[("h2", "h0")]) > 4 * gbits[("h0", "h1")], gbits
    assert net.only_sshd_left()  # the next test's ranks start on hosts as they were


@pytest.mark.e2e
def test_linktest_names_a_dead_cable_in_seconds(ring: MultiHost, tmp_path: Path) -> None:
    """Every packet on the h1-h2 cable dropped: linktest fails fast, naming that link."""
    net = ring
    net.drop_all(1, 2)
    started = time.monotonic()
    try:
        result = run_cli("linktest", str(ring_config(tmp_path, net)), timeout=60)
    finally:
        net.clear(1, 2)
    assert result.returncode == 1, result.stdout + result.stderr
    assert time.monotonic() - started < 20
    row = next(line for line in result.stdout.splitlines() if net.hosts[2].data_ips[1] in line)
    assert "h1" in row and "h2" in row and "no answer" in row
