"""No request of death, end to end: a request that crashes a rank on insert is answered
with an error after its isolated run, the others complete, the cluster serves on."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from testkit.orchestrator_process import Orchestrator, gateway_status, write_cluster

pytestmark = pytest.mark.e2e

TWO_LOCAL = [{"name": "a", "ip": "127.0.0.1"}, {"name": "b", "ip": "127.0.0.1"}]
FAST_RESTARTS = {"backoff_initial_s": 0.5, "backoff_max_s": 2.0, "stop_grace_s": 2.0}
POISON = "zebra-of-death"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> Iterator[str]:
    tmp = tmp_path_factory.mktemp("death")
    config = write_cluster(
        tmp, str(tiny_model_dir), TWO_LOCAL, model={"id": "tiny"},
        supervisor=FAST_RESTARTS, serving={"max_batch_size": 4},
    )
    import tomllib

    api = tomllib.loads(config.read_text())["api"]
    url = f"http://{api['host']}:{api['port']}"
    orchestrator = Orchestrator(
        config, env={"ORCHESTRATOR_FAULT": f"crash_on:rank=1:text={POISON}"})
    try:
        orchestrator.wait_ready(url)
        yield url
    finally:
        orchestrator.stop()
        print("orchestrator output (last 80 lines):\n" + "\n".join(orchestrator.output[-80:]))


def _metric(url: str, name: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name:
                return float(sample.value)
    return 0.0


def test_request_of_death_is_answered_with_an_error_and_the_rest_complete(cluster: str) -> None:
    """3 innocent requests complete, the poisoned one gets a 500 in Anthropic's shape
    naming the crash, within 2 restarts, and the cluster is ready afterwards."""
    answers: dict[str, httpx.Response] = {}

    def send(name: str, path: str, body: dict[str, Any]) -> None:
        answers[name] = httpx.post(f"{cluster}{path}", json=body, timeout=240)

    innocent = {"model": "tiny", "max_tokens": 3, "temperature": 0}
    threads = [
        threading.Thread(target=send, args=(f"ok{i}", "/v1/completions",
                                            {**innocent, "prompt": f"Hello {i}"}))
        for i in range(3)
    ]
    threads.append(threading.Thread(target=send, args=("poison", "/v1/messages", {
        "model": "tiny", "max_tokens": 3,
        "messages": [{"role": "user", "content": f"say {POISON}"}],
    })))
    for thread in threads:
        thread.start()
        time.sleep(0.05)
    for thread in threads:
        thread.join(300)
    for i in range(3):
        assert answers[f"ok{i}"].status_code == 200, answers[f"ok{i}"].text
    poison = answers["poison"]
    assert poison.status_code == 500, poison.text
    body = poison.json()
    assert body["type"] == "error" and body["error"]["type"] == "api_error", body
    assert "crashed the model server" in body["error"]["message"], body
    assert "rank 1" in body["error"]["message"], body  # the cause, as the supervisor saw it
    deadline = time.monotonic() + 120
    while gateway_status(cluster).get("state") != "ready" and time.monotonic() < deadline:
        time.sleep(0.3)
    status = gateway_status(cluster)
    assert status["state"] == "ready" and status["restarts"] <= 2, status
    assert _metric(cluster, "orchestrator_requests_quarantined_total") == 1
    assert _metric(cluster, "orchestrator_request_of_death_restarts_total") == 2
    after = httpx.post(f"{cluster}/v1/completions", json={**innocent, "prompt": "Hi"},
                       timeout=120)
    assert after.status_code == 200, after.text
