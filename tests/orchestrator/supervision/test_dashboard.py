"""The Grafana dashboard and alert rules against a real Prometheus scraping a real cluster.

Every expression of every panel and rule must evaluate, and return series, on metrics of a
cluster that served requests and went through one restart.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from testkit import paths, require
from testkit.orchestrator_process import gateway_status, running, write_cluster
from testkit.ports import free_port
from testkit.require import missing

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]
DOCS = paths.ROOT / "docs"
# Grafana fills these in; the test stands in with what they would be at a 1 s scrape.
VARIABLES = {"$__rate_interval": "1m", "$__interval": "5s", "${datasource}": ""}
THRESHOLD = re.compile(r"\s*(<|>|<=|>=|==|!=)\s*[\d.]+\s*$")  # an alert's comparison
ABSENT = re.compile(r"^absent\((.*)\)$")  # absent(x) compares x's presence


def expressions() -> list[tuple[str, str]]:
    """(where, PromQL) of every panel target of the dashboard and every alert rule."""
    dashboard = json.loads((DOCS / "grafana" / "mlx-cluster.json").read_text())
    found = [
        (f"panel {panel['title']!r}", target["expr"])
        for panel in dashboard["panels"]
        for target in panel["targets"]
    ]
    rules = (DOCS / "prometheus" / "alerts.yml").read_text()
    for name, expr in _rules(rules):
        # A healthy cluster fires no alert: the rule itself may be empty, but it must
        # evaluate, and what it compares must have series.
        found.append((f"rule {name}", expr))
        compared = ABSENT.sub(r"\1", THRESHOLD.sub("", expr))
        found.append((f"rule {name} (compared)", compared))
    return found


def _rules(text: str) -> Iterator[tuple[str, str]]:
    """(alert, expr) from the rule file; folded `>` expressions joined (no YAML dependency)."""
    for block in text.split("- alert: ")[1:]:
        name = block.split("\n", 1)[0].strip()
        match = re.search(r"expr: (>\n((?:\s{10,}.*\n)+)|.*)", block)
        assert match is not None, block
        yield name, " ".join((match.group(2) or match.group(1)).split())


def _needs_series(where: str) -> bool:
    """Panels and the compared side of a rule must have series; a rule itself fires none."""
    return not where.startswith("rule") or where.endswith("(compared)")


def substituted(expr: str) -> str:
    for name, value in VARIABLES.items():
        expr = expr.replace(name, value)
    return expr


@pytest.fixture
def prometheus(tmp_path: Path) -> Iterator[tuple[Path, str]]:
    """A real Prometheus (Debian's); yields (its config file, its URL); stopped by PID."""
    binary = shutil.which("prometheus")
    if binary is None:
        missing("prometheus is missing (apt-get install prometheus)", require.PROMETHEUS)
    port = free_port()
    config = tmp_path / "prometheus.yml"
    yield config, f"http://127.0.0.1:{port}"


def start_prometheus(config: Path, url: str, tmp: Path) -> subprocess.Popen[bytes]:
    port = url.rsplit(":", 1)[1]
    log = (tmp / "prometheus.log").open("wb")
    process = subprocess.Popen(
        [
            "prometheus", f"--config.file={config}", f"--storage.tsdb.path={tmp / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/-/ready", timeout=1).status_code == 200:
                return process
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    process.kill()
    raise AssertionError((tmp / "prometheus.log").read_text())


def query(url: str, expr: str) -> dict[str, object]:
    reply = httpx.get(f"{url}/api/v1/query", params={"query": expr}, timeout=10)
    return dict(reply.json())


def evaluate(prom_url: str) -> list[str]:
    """Each expression that errors or, where it must have some, returns no series."""
    failures = []
    for where, expr in expressions():
        answer = query(prom_url, substituted(expr))
        data = answer.get("data")
        if answer.get("status") != "success" or not isinstance(data, dict):
            failures.append(f"{where}: {answer.get('error')}: {expr}")
        elif not data.get("result") and _needs_series(where):
            failures.append(f"{where}: no series: {expr}")
    return failures


def complete(gateway: str, model: str) -> None:
    body = {"model": model, "prompt": "Hello", "max_tokens": 8, "temperature": 0}
    httpx.post(f"{gateway}/v1/completions", json=body, timeout=60).raise_for_status()


def test_every_panel_and_rule_evaluates_with_series(
    prometheus: tuple[Path, str], tmp_path: Path, tiny_model_dir: Path
) -> None:
    """Prometheus scrapes a cluster every second through requests and one restart; then
    each dashboard and alert expression returns at least one series, none errors."""
    config_file, prom_url = prometheus
    nodes = [{"name": "a", "ip": "127.0.0.1"}, {"name": "b", "ip": "127.0.0.1"}]
    config = write_cluster(tmp_path, str(tiny_model_dir), nodes,
                           supervisor={"backoff_initial_s": 0.5, "standby_ranks": False})
    api = tomllib.loads(config.read_text())["api"]
    gateway = f"http://{api['host']}:{api['port']}"
    scrape = (DOCS / "prometheus" / "prometheus.yml").read_text()
    scrape = scrape.replace("10s", "1s").replace("127.0.0.1:8000", f"{api['host']}:{api['port']}")
    config_file.write_text(scrape)
    shutil.copy(DOCS / "prometheus" / "alerts.yml", config_file.parent / "alerts.yml")
    with running(config, url=gateway):
        prom = start_prometheus(config_file, prom_url, tmp_path)
        try:
            for _ in range(4):
                complete(gateway, tiny_model_dir.name)
            status = gateway_status(gateway)  # as `status --json`, without a CLI's start
            os.kill(int(status["ranks"][1]["pid"]), 9)
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                time.sleep(0.5)
                status = gateway_status(gateway)
                if status["state"] == "ready" and status["restarts"] == 1:
                    break
            for _ in range(4):
                complete(gateway, tiny_model_dir.name)
            text = httpx.get(f"{gateway}/metrics", timeout=10).text
            lint = subprocess.run(["promtool", "check", "metrics"], input=text,
                                  capture_output=True, text=True, check=False)
            assert lint.returncode == 0, lint.stdout + lint.stderr
            # A rate needs two scrapes after the last requests: asked again until every
            # expression has its series (or 15 s).
            deadline = time.monotonic() + 15
            while (failures := evaluate(prom_url)) and time.monotonic() < deadline:
                time.sleep(0.5)
            assert failures == []
        finally:
            prom.terminate()
            prom.wait(10)
