"""Requests through a real gateway to a real rank: clients that leave, paths, bad bytes."""

from __future__ import annotations

import http.client
import threading
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from testkit.orchestrator_process import running, write_cluster

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]
LONG = 4000  # tokens: far longer than the clients below wait


class Gateway:
    def __init__(self, url: str, model: str) -> None:
        self.url, self.model = url, model
        self.host, port = url.removeprefix("http://").split(":")
        self.port = int(port)

    def pending(self) -> float:
        """Requests rank 0 still runs or queues, read through the gateway's /metrics."""
        text = httpx.get(f"{self.url}/metrics", timeout=10).text
        return sum(
            sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples
            if sample.name in ("serving_requests_running", "serving_requests_waiting")
        )

    def raw(self, method: str, path: str, body: bytes = b"", **headers: str) -> tuple[int, str]:
        """A request sent as is: no client-side path normalisation or header encoding."""
        connection = http.client.HTTPConnection(self.host, self.port, timeout=30)
        try:
            connection.putrequest(method, path, skip_accept_encoding=True)
            for name, value in headers.items():
                connection.putheader(name, value.encode("latin-1"))
            connection.putheader("Content-Length", str(len(body)))
            connection.endheaders(body)
            reply = connection.getresponse()
            return reply.status, reply.read().decode(errors="replace")
        finally:
            connection.close()


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> Iterator[Gateway]:
    """One local rank of the tiny model behind the gateway."""
    tmp = tmp_path_factory.mktemp("gateway")
    config = write_cluster(tmp, str(tiny_model_dir), [{"name": "a"}], supervisor={
        "standby_ranks": False})
    api = tomllib.loads(config.read_text())["api"]
    url = f"http://{api['host']}:{api['port']}"
    with running(config, url=url):
        yield Gateway(url, tiny_model_dir.name)


def give_up_after(gateway: Gateway, seconds: float, stream: bool, errors: list[str]) -> None:
    """Wait `seconds` for the answer (a stream: read it that long), then hang up."""
    body = {"model": gateway.model, "prompt": "Tell", "max_tokens": LONG, "stream": stream}
    deadline = time.monotonic() + seconds
    try:
        with httpx.stream("POST", f"{gateway.url}/v1/completions", json=body,
                          timeout=seconds) as reply:
            for _ in reply.iter_raw():
                if time.monotonic() > deadline:
                    return  # leaving the block closes the connection mid-stream
    except httpx.TimeoutException:
        return
    errors.append("the request finished before the client gave up")


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_clients_that_leave_free_their_batch_slots(gateway: Gateway, stream: bool) -> None:
    """Six clients give up after 1.5 s: rank 0 drops their requests (it ran them for
    minutes before); the next request is served at once."""
    errors: list[str] = []
    clients = [
        threading.Thread(target=give_up_after, args=(gateway, 1.5, stream, errors))
        for _ in range(6)
    ]
    for client in clients:
        client.start()
    for client in clients:
        client.join(30)
    assert errors == []
    deadline = time.monotonic() + 10
    while gateway.pending() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert gateway.pending() == 0
    body = {"model": gateway.model, "prompt": "Hi", "max_tokens": 4}
    assert httpx.post(f"{gateway.url}/v1/completions", json=body, timeout=30).status_code == 200


@pytest.mark.parametrize("path", ["/v1/../health", "/v1/%2e%2e/metrics", "/v1/./models",
                                  "/v1/%2E%2E/%2E%2E/status"])
def test_only_rank0s_v1_routes_are_reachable(gateway: Gateway, path: str) -> None:
    """Dot segments, plain or encoded, are refused with 404 in OpenAI's shape."""
    status, text = gateway.raw("GET", path)
    assert status == 404 and '"error"' in text and "serving_" not in text


def test_a_body_that_is_not_utf8_is_a_400(gateway: Gateway) -> None:
    """Bytes that are not UTF-8 JSON get 400 in OpenAI's shape, from the gateway's path."""
    status, text = gateway.raw(
        "POST", "/v1/completions", b'{"model": "m", "prompt": "\xff\xfe"}',
        **{"Content-Type": "application/json"},
    )
    assert status == 400 and '"error"' in text


def test_a_header_that_is_not_utf8_is_a_400_and_utf8_ones_pass(gateway: Gateway) -> None:
    """A header value with non-UTF-8 bytes is a 400 naming it; UTF-8 beyond ASCII is fine."""
    status, text = gateway.raw("GET", "/v1/models", **{"X-Note": "caf\xe9"})
    assert status == 400 and "x-note" in text and '"error"' in text
    utf8 = "café".encode().decode("latin-1")  # sent as the UTF-8 bytes of "café"
    assert gateway.raw("GET", "/v1/models", **{"X-Note": utf8})[0] == 200


def test_metrics_content_type_names_its_charset_once(gateway: Gateway) -> None:
    """/metrics is Prometheus text with one charset parameter."""
    content_type = httpx.get(f"{gateway.url}/metrics", timeout=10).headers["content-type"]
    assert content_type.count("charset") == 1 and content_type.startswith("text/plain")
