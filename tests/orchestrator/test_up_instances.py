"""`orchestrator up` with `[[instances]]`: two models and two replicas on local nodes,
behind one gateway (routing, balancing, failover, status, metrics, adoption)."""

from __future__ import annotations

import concurrent.futures
import json
import os
import signal
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import tomli_w
from prometheus_client.parser import text_string_to_metric_families

from contract.blas import find_openblas
from testkit.orchestrator_process import (
    Orchestrator,
    gateway_status,
    kill_all,
    run_cli,
    running,
    write_cluster,
)
from testkit.ports import free_port_block
from testkit.waiting import wait_until

pytestmark = pytest.mark.e2e

NODES = [{"name": "r0", "ip": "127.0.0.1"}, {"name": "r1", "ip": "127.0.0.1"}]
HAIKU = "claude-haiku-4-5"


class Cluster:
    def __init__(self, orchestrator: Orchestrator, config: Path, url: str, api0: int) -> None:
        self.orchestrator, self.config, self.url = orchestrator, config, url
        self.rank0_port = {"big-a": api0, "big-b": api0 + 1, "small": api0 + 2}

    def instances(self) -> dict[str, dict[str, Any]]:
        return {i["name"]: i for i in gateway_status(self.url).get("instances", [])}

    def all_ready(self) -> bool:
        found = self.instances()
        return len(found) == 3 and all(i["state"] == "ready" for i in found.values())

    def finished_at(self, instance: str) -> float:
        """Requests rank 0 of `instance` finished: which rank process did the work."""
        text = httpx.get(f"http://127.0.0.1:{self.rank0_port[instance]}/metrics").text
        return sum(sample.value for family in text_string_to_metric_families(text)
                   if family.name == "serving_requests_finished"
                   for sample in family.samples if sample.name.endswith("_total"))


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> Iterator[Cluster]:
    """Two replicas of "big" (one rank each, on r0 and r1) and "small" on r0 (aliased to
    Claude Code's haiku name), all the tiny model: 3 rank processes."""
    tmp = tmp_path_factory.mktemp("instances")
    api0 = free_port_block(3)
    config = write_cluster(
        tmp, str(tiny_model_dir), NODES,
        cluster={"rank_port": free_port_block(3)},
        serving={"rank_api_port": api0},
        supervisor={"standby_ranks": False, "orphan_grace_s": 120.0,
                    "backoff_initial_s": 0.2},
    )
    data = tomllib.loads(config.read_text())
    model = str(tiny_model_dir)
    data["instances"] = [
        {"name": "big-a", "model": model, "id": "big", "nodes": ["r0"]},
        {"name": "big-b", "model": model, "id": "big", "nodes": ["r1"]},
        {"name": "small", "model": model, "id": "small", "nodes": ["r0"], "aliases": [HAIKU]},
    ]
    config.write_text(tomli_w.dumps(data))
    url = f"http://{data['api']['host']}:{data['api']['port']}"
    with running(config, url=url) as orchestrator:
        made = Cluster(orchestrator, config, url, api0)
        wait_until(made.all_ready, 300, "every instance ready")
        yield made


def _counted(url: str, name: str) -> dict[tuple[str, str], float]:
    """The gateway's /metrics family `name`: (model_instance, status) -> value."""
    text = httpx.get(f"{url}/metrics").text
    return {(s.labels.get("model_instance", ""), s.labels.get("status", "")): s.value
            for f in text_string_to_metric_families(text) for s in f.samples
            if s.name == name}


def _delta(after: dict[Any, float], before: dict[Any, float]) -> dict[Any, float]:
    return {key: value - before.get(key, 0.0) for key, value in after.items()
            if value != before.get(key, 0.0)}


def _chat(url: str, model: str, tokens: int = 8, **extra: Any) -> httpx.Response:
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": tokens, **extra}
    return httpx.post(f"{url}/v1/chat/completions", json=body, timeout=120)


def test_routes_by_id_and_alias_and_404_lists_the_ids(cluster: Cluster) -> None:
    """An id and an alias reach their model; an unknown one is a 404 in each API's shape
    naming the ids; /v1/models lists each id once."""
    assert _chat(cluster.url, "big").json()["model"] == "big"
    assert _chat(cluster.url, HAIKU).json()["model"] == "small"
    unknown = _chat(cluster.url, "gpt-5")
    assert unknown.status_code == 404
    error = unknown.json()["error"]
    assert error["code"] == "model_not_found" and "big, small" in error["message"]
    anthropic = httpx.post(f"{cluster.url}/v1/messages", json={
        "model": "claude-opus-4", "max_tokens": 4,
        "messages": [{"role": "user", "content": "hi"}]}, timeout=30)
    assert anthropic.status_code == 404 and anthropic.json()["type"] == "error"
    assert "big, small" in anthropic.json()["error"]["message"]
    responses = httpx.post(f"{cluster.url}/v1/responses",
                           json={"model": "nope", "input": "hi"}, timeout=30)
    assert responses.status_code == 404 and "big, small" in responses.text
    listed = httpx.get(f"{cluster.url}/v1/models").json()["data"]
    assert [card["id"] for card in listed] == ["big", "small"]


def test_requests_go_to_the_replica_with_least_work(cluster: Cluster) -> None:
    """Four streams opened one after another, each held: two on each replica's rank.
    Greedy: the tiny model never picks EOS then (testkit/tiny_model.py), so no stream ends
    before the last is routed (sampled, one ended early once in six whole-suite runs)."""
    before = {name: cluster.finished_at(name) for name in ("big-a", "big-b", "small")}
    body = {"model": "big", "stream": True, "max_tokens": 300, "temperature": 0,
            "messages": [{"role": "user", "content": "hi"}]}
    with httpx.Client(timeout=120) as client:
        streams, held = [], []
        try:
            for _ in range(4):
                stream = client.stream("POST", f"{cluster.url}/v1/chat/completions", json=body)
                streams.append(stream)
                lines = stream.__enter__().iter_lines()
                next(line for line in lines if line.startswith("data:"))  # under way
                held.append(lines)
            for lines in held:
                assert "data: [DONE]" in list(lines)
        finally:
            for stream in streams:
                stream.__exit__(None, None, None)

    def done() -> dict[str, float]:
        return {name: cluster.finished_at(name) - before[name] for name in before}

    wait_until(lambda: sum(done().values()) >= 4, 60, "the four streams ended")
    assert done() == {"big-a": 2, "big-b": 2, "small": 0}


def test_status_and_metrics_show_every_instance(cluster: Cluster) -> None:
    """`status --json` lists each instance (model, nodes, ranks, mode, state, restarts);
    /metrics labels the orchestrator's series with model_instance; /health names them;
    the ranks of every instance on this machine split its cores for BLAS."""
    result = run_cli("status", str(cluster.config), "--json")
    assert result.returncode == 0, result.stderr
    status = json.loads(result.stdout)
    shown = {i["name"]: i for i in status["instances"]}
    assert set(shown) == {"big-a", "big-b", "small"}
    assert shown["small"]["model"] == "small" and shown["small"]["aliases"] == [HAIKU]
    assert shown["big-b"]["nodes"] == ["r1"] and shown["big-b"]["mode"] == "tensor"
    assert [r["node"] for r in shown["big-b"]["ranks"]] == ["r1"]
    text = httpx.get(f"{cluster.url}/metrics").text
    states = {s.labels["model_instance"] for f in text_string_to_metric_families(text)
              if f.name == "orchestrator_state" for s in f.samples}
    assert states == {"big-a", "big-b", "small"}
    assert httpx.get(f"{cluster.url}/health").status_code == 200
    answers = "orchestrator_responses_total"
    before = _counted(cluster.url, answers)
    assert _chat(cluster.url, HAIKU).status_code == 200
    assert _chat(cluster.url, "gpt-5").status_code == 404
    # Under the instance that served it; a request no instance saw without the label.
    assert _delta(_counted(cluster.url, answers), before) == {("small", "200"): 1,
                                                               ("", "404"): 1}
    with httpx.stream("GET", f"{cluster.url}/status/live", timeout=30) as live:
        history = json.loads(next(line for line in live.iter_lines()
                                  if line.startswith("data:"))[5:])
    assert set(history["samples"][-1]["instances"]) == {"big-a", "big-b", "small"}
    if find_openblas():  # replicas on one machine split its cores: 3 ranks, 2 cores here
        blas = [line for line in cluster.orchestrator.output if "BLAS: OpenBLAS" in line]
        expected = f", {max(1, len(os.sched_getaffinity(0)) // 3)} threads"
        assert len(blas) == 3 and all(line.endswith(expected) for line in blas), blas


def test_a_replica_killed_under_load_loses_no_request(cluster: Cluster) -> None:
    """kill -9 of big-a's rank while requests run: every request answered (the other
    replica takes them), small untouched, big-a back."""
    before = cluster.instances()
    pid = before["big-a"]["ranks"][0]["pid"]
    resent = _counted(cluster.url, "orchestrator_requests_retried_total")
    answered = _counted(cluster.url, "orchestrator_responses_total")
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        calls = [pool.submit(_chat, cluster.url, "big", 40) for _ in range(24)]
        os.kill(pid, signal.SIGKILL)
        statuses = [call.result().status_code for call in calls]
    assert statuses == [200] * 24
    # Each answer booked under the replica that served it, resends (if the kill caught
    # any request) under the one that lost them.
    served = _delta(_counted(cluster.url, "orchestrator_responses_total"), answered)
    assert set(served) <= {("big-a", "200"), ("big-b", "200")} and sum(served.values()) == 24
    lost = _delta(_counted(cluster.url, "orchestrator_requests_retried_total"), resent)
    assert set(lost) <= {("big-a", "")}, lost
    wait_until(lambda: cluster.instances()["big-a"]["restarts"] == 1, 60, "big-a restarted")
    wait_until(cluster.all_ready, 120, "big-a back")
    after = cluster.instances()
    assert after["small"]["launch_id"] == before["small"]["launch_id"]
    assert after["small"]["restarts"] == 0 and after["big-b"]["restarts"] == 0
    assert _chat(cluster.url, "big").status_code == 200


def test_every_instance_is_adopted_after_kill_9(cluster: Cluster) -> None:
    """The orchestrator killed: a new `up` adopts each instance's gang, no relaunch."""
    launches = {name: i["launch_id"] for name, i in cluster.instances().items()}
    pids = cluster.orchestrator.remember_descendants()
    cluster.orchestrator.process.kill()
    cluster.orchestrator.wait_exit()
    try:
        with running(cluster.config, url=cluster.url) as second:
            wait_until(cluster.all_ready, 120, "every instance adopted")
            adopted = {name: i["launch_id"] for name, i in cluster.instances().items()}
            assert adopted == launches
            assert second.text.count("adopted launch") == 3, second.text
            assert _chat(cluster.url, HAIKU).status_code == 200
    finally:
        kill_all(pids)
