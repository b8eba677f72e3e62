"""`orchestrator up` in pipeline mode, end to end: 2 local ranks of a tiny model with the
bundled SmolLM2's head counts (9 heads: tensor parallelism cannot split them over 2) and
6 layers, memory_gb 2 : 1."""

from __future__ import annotations

import json
import os
import signal
import time
import tomllib
from pathlib import Path

import httpx
import pytest

from testkit.nine_heads import write_nine_heads_model
from testkit.orchestrator_process import gateway_status, run_cli, running, write_cluster
from testkit.waiting import metric_value

pytestmark = pytest.mark.e2e
LAYERS = 6

NODES = [
    {"name": "big", "ip": "127.0.0.1", "memory_gb": 2.0},
    {"name": "small", "ip": "127.0.0.1", "memory_gb": 1.0},
]


def answer(url: str, model: str) -> str:
    r = httpx.post(f"{url}/v1/chat/completions", timeout=300, json={
        "model": model, "max_tokens": 8, "temperature": 0,
        "messages": [{"role": "user", "content": "What is the capital of France?"}],
    })
    assert r.status_code == 200, r.text
    return str(r.json()["choices"][0]["message"]["content"])


def status(config: Path) -> dict[str, object]:
    """`status --json` (it exits 1 while the cluster is not ready, with the same JSON)."""
    result = run_cli("status", str(config), "--json")
    assert result.stdout, result.stderr
    return dict(json.loads(result.stdout))


def test_pipeline_placement_serves_and_recovers_a_killed_rank(tmp_path: Path) -> None:
    """plan --json and status --json show each rank's layers, weighted to the 2 GiB node;
    /metrics shows them; kill -9 of the rank with the first layers restarts the gang,
    which answers as before."""
    model = write_nine_heads_model(tmp_path / "nine-heads", LAYERS)
    config = write_cluster(tmp_path, str(model), NODES)
    planned = run_cli("plan", str(config), "--json")
    assert planned.returncode == 0, planned.stderr
    placement = json.loads(planned.stdout)["placement"]
    assert placement["mode"] == "pipeline" and "do not divide by 2 ranks" in placement["reason"]
    (big_start, big_end), (small_start, small_end) = (r["layers"] for r in placement["ranks"])
    assert (small_start, big_end, small_end) == (0, LAYERS, big_start)
    assert big_end - big_start > small_end - small_start  # the 2 GiB node holds more

    url = f"http://127.0.0.1:{tomllib.loads(config.read_text())['api']['port']}"
    with running(config, url=url) as orchestrator:
        before = answer(url, model.name)
        shown = status(config)
        assert shown["placement"] == placement
        assert metric_value(url, 'orchestrator_rank_layers{edge="start",node="big",rank="0"}') \
            == big_start
        ranks = {r["rank"]: r["pid"] for r in shown["ranks"]}  # type: ignore[union-attr]
        os.kill(ranks[1], signal.SIGKILL)
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            now = gateway_status(url)  # what status --json shows, without a CLI per poll
            if now.get("state") == "ready" and now["restarts"] == 1:
                break
            time.sleep(1)
        else:
            raise AssertionError(f"not ready again after the kill:\n{orchestrator.text[-3000:]}")
        assert "rank_crashed" in str(now["last_cause"]) or "peer_lost" in str(now["last_cause"])
        assert answer(url, model.name) == before
