"""Requests through a real gateway to a real rank: clients that leave, paths, bad bytes."""

from __future__ import annotations

import contextlib
import http.client
import json
import signal
import threading
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from contract.http_limits import HEAD_TIMEOUT_S, raise_file_limit
from testkit.orchestrator_process import (
    Orchestrator,
    run_cli,
    running,
    wait_gone,
    write_cluster,
)
from testkit.raw_http import HALF_HEAD, closed_by_server, half_sent

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]
# Tokens a leaving client asked for: no machine makes that many in the clients' 1.5 s
# (the tiny model's context is raised to fit them), so only a cancel can end them.
LONG = 190_000
BATCH = 6  # batch slots: the six clients fill them all, so the next request needs a freed one


def without_eos(model_dir: Path) -> dict[str, float]:
    """A logit_bias that keeps a sampled answer from ending on EOS before max_tokens."""
    eos = json.loads((model_dir / "config.json").read_text())["eos_token_id"]
    return {str(token): -100.0 for token in (eos if isinstance(eos, list) else [eos])}


class Gateway:
    def __init__(
        self, url: str, rank0_url: str, model_dir: Path, orchestrator: Orchestrator,
        config: Path,
    ) -> None:
        self.url, self.rank0_url, self.model = url, rank0_url, model_dir.name
        self.config = config
        self.logit_bias = without_eos(model_dir)
        self.orchestrator = orchestrator
        self.host, port = url.removeprefix("http://").split(":")
        self.port = int(port)

    def rank0_metric(self, name: str, **labels: str) -> float:
        """A serving_* sample from rank 0's own /metrics: an error or a missing sample
        fails the test, never reads as 0."""
        reply = httpx.get(f"{self.rank0_url}/metrics", timeout=10)
        reply.raise_for_status()
        for family in text_string_to_metric_families(reply.text):
            for sample in family.samples:
                if sample.name == name and labels.items() <= sample.labels.items():
                    return sample.value
        raise AssertionError(f"rank 0's /metrics has no {name} {labels}")

    def finished(self) -> float:
        return sum(self.rank0_metric("serving_requests_finished_total", finish_reason=reason)
                   for reason in ("stop", "length"))

    def cancels_logged(self) -> int:
        """Rank 0's own log lines for requests it removed because their client left."""
        return sum("(cancelled)" in line for line in self.orchestrator.output)

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
    """One local rank of the tiny model behind the gateway; stop_grace_s 30 s for the
    drain test, which ends it."""
    tmp = tmp_path_factory.mktemp("gateway")
    config = write_cluster(
        tmp, str(tiny_model_dir), [{"name": "a"}],
        supervisor={"standby_ranks": False, "stop_grace_s": 30.0},
        model={"context_length": LONG + 100},
        serving={"max_tokens_limit": LONG, "max_batch_size": BATCH},
    )
    data = tomllib.loads(config.read_text())
    url = f"http://{data['api']['host']}:{data['api']['port']}"
    with running(config, url=url) as orchestrator:
        rank0_url = f"http://127.0.0.1:{data['serving']['rank_api_port']}"
        yield Gateway(url, rank0_url, tiny_model_dir, orchestrator, config)


def give_up_after(gateway: Gateway, seconds: float, stream: bool, errors: list[str]) -> None:
    """Wait `seconds` for the answer (a stream: read it that long), then hang up."""
    body = {"model": gateway.model, "prompt": "Tell", "max_tokens": LONG, "stream": stream,
            "logit_bias": gateway.logit_bias}
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
    """Six clients fill every batch slot with requests no machine finishes in time and
    give up after 1.5 s: rank 0 logs each one cancelled, finishes none and runs none; the
    next request gets a freed slot and is served at once."""
    errors: list[str] = []
    cancels, finished = gateway.cancels_logged(), gateway.finished()
    clients = [
        threading.Thread(target=give_up_after, args=(gateway, 1.5, stream, errors))
        for _ in range(BATCH)
    ]
    for client in clients:
        client.start()
    for client in clients:
        client.join(30)
    assert errors == []
    deadline = time.monotonic() + 10
    while gateway.cancels_logged() - cancels < BATCH and time.monotonic() < deadline:
        time.sleep(0.2)
    assert gateway.cancels_logged() - cancels == BATCH, gateway.orchestrator.text[-3000:]
    assert gateway.rank0_metric("serving_requests_pending") == 0
    assert gateway.finished() == finished
    body = {"model": gateway.model, "prompt": "Hi", "max_tokens": 4}
    started = time.monotonic()
    reply = httpx.post(f"{gateway.url}/v1/completions", json=body, timeout=30)
    served_s = time.monotonic() - started
    assert reply.status_code == 200 and served_s < 3.0, (reply.status_code, served_s)


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


def test_half_sent_requests_are_closed_while_both_servers_serve(gateway: Gateway) -> None:
    """200 half-sent request heads held on the gateway and 200 on rank 0: the gateway's
    /health and a chat request still answer, and both servers close all 400 within their
    head deadline."""
    raise_file_limit()
    rank0 = gateway.rank0_url.removeprefix("http://").split(":")
    held = half_sent(gateway.host, gateway.port, 200, HALF_HEAD)
    held += half_sent(rank0[0], int(rank0[1]), 200, HALF_HEAD)
    assert httpx.get(f"{gateway.url}/health", timeout=10).status_code == 200
    body = {"model": gateway.model, "messages": [{"role": "user", "content": "Hi"}],
            "max_tokens": 2}
    assert httpx.post(f"{gateway.url}/v1/chat/completions", json=body, timeout=30).is_success
    assert closed_by_server(held, HEAD_TIMEOUT_S + 3.0) == 400


def test_a_metrics_flood_neither_restarts_the_gang_nor_stalls_rank_0(gateway: Gateway) -> None:
    """/metrics scraped 100 times a second for 3 s: every scrape answers, the gang is not
    restarted and rank 0's /health stays quick."""
    restarts = gateway_restarts(gateway)
    with httpx.Client(timeout=5) as client:
        start, scrapes = time.monotonic(), 0
        while (elapsed := time.monotonic() - start) < 3.0:
            assert client.get(f"{gateway.url}/metrics").status_code == 200
            scrapes += 1
            time.sleep(max(0.0, scrapes / 100 - elapsed))
        assert client.get(f"{gateway.rank0_url}/health").status_code == 200
    assert gateway_restarts(gateway) == restarts
    assert httpx.get(f"{gateway.url}/health", timeout=5).status_code == 200


def gateway_restarts(gateway: Gateway) -> float:
    text = httpx.get(f"{gateway.url}/metrics", timeout=5).text
    return sum(sample.value for family in text_string_to_metric_families(text)
               for sample in family.samples if sample.name == "orchestrator_restarts_total")


def test_a_long_prompt_is_tokenized_off_rank_0s_event_loop(gateway: Gateway) -> None:
    """count_tokens on a 1.5 MB prompt (about 1.5 s of tokenizing on a quiet 2-core box,
    more under load): rank 0's /health keeps answering within a fraction of that."""
    text = "the quick brown fox jumps over the lazy dog. " * 33_000
    body = {"model": gateway.model, "messages": [{"role": "user", "content": text}]}
    answers: list[httpx.Response] = []
    counting = threading.Thread(target=lambda: answers.append(httpx.post(
        f"{gateway.url}/v1/messages/count_tokens", json=body, timeout=60)))
    slowest, started = 0.0, time.monotonic()
    counting.start()
    with httpx.Client(timeout=10) as client:
        while counting.is_alive():
            asked = time.monotonic()
            client.get(f"{gateway.rank0_url}/health")
            slowest = max(slowest, time.monotonic() - asked)
            time.sleep(0.01)
    took = time.monotonic() - started
    assert answers[0].status_code == 200, answers[0].text[:300]
    assert answers[0].json()["input_tokens"] > 270_000
    assert took > 0.8, f"tokenizing took only {took:.2f} s: too quick to tell"
    assert slowest < 0.3, f"/health waited {slowest:.2f} s while a prompt was tokenized"


# Last: it ends the module's cluster.
def test_down_drains_and_a_second_ctrl_c_skips_the_drain(gateway: Gateway) -> None:
    """`down` while two streams run: one of about 3 s is drained to its normal end; the
    other cannot end within stop_grace_s (30 s), so `up` is still there after the first;
    a second Ctrl-C ends it and its ranks within seconds. (The module's cluster: this
    test ends it, so it runs last.)"""
    config, url, orchestrator = gateway.config, gateway.url, gateway.orchestrator
    body = {"model": gateway.model, "prompt": "Tell", "max_tokens": 200,
            "logit_bias": gateway.logit_bias}
    short: list[str] = []  # its data lines, then when it ended

    def stream(max_tokens: int, streaming: threading.Event, lines: list[str] | None = None,
               ) -> None:
        with contextlib.suppress(httpx.HTTPError), httpx.stream(
            "POST", f"{url}/v1/completions", timeout=60,
            json={**body, "max_tokens": max_tokens, "stream": True},
        ) as reply:
            for line in reply.iter_lines():
                streaming.set()
                if lines is not None and line:
                    lines.append(line)
        if lines is not None:
            lines.append(str(time.monotonic()))

    pids = orchestrator.remember_descendants()
    started = time.monotonic()
    httpx.post(f"{url}/v1/completions", json=body, timeout=60).raise_for_status()
    # About 3 s of tokens on this machine: it outlasts `down`'s start, not the grace.
    tokens = min(LONG, int(3.0 * 200 / (time.monotonic() - started)))
    endless_streaming, drained_streaming = threading.Event(), threading.Event()
    endless = threading.Thread(target=stream, args=(LONG, endless_streaming))
    endless.start()
    assert endless_streaming.wait(30)
    drained = threading.Thread(target=stream, args=(tokens, drained_streaming, short))
    drained.start()
    # `down` once both stream (one sent after the drain began is refused, by design).
    assert drained_streaming.wait(30)
    down = threading.Thread(target=run_cli, args=("down", str(config)))
    down.start()
    drained.join(30)
    assert len(short) >= 3 and short[-2] == "data: [DONE]", short[-3:]
    assert '"finish_reason":"length"' in short[-3], short[-3:]
    stopping = [at for at, line in orchestrator.lines if at > started and "stopping: " in line]
    assert stopping and stopping[0] < float(short[-1]), "it ended before the stop began"
    assert orchestrator.process.poll() is None, "`down` did not wait for the endless stream"
    second = time.monotonic()
    orchestrator.process.send_signal(signal.SIGINT)
    orchestrator.wait_exit(15)
    exited_s = time.monotonic() - second
    endless.join(30)
    down.join(30)
    assert wait_gone(pids, 5) == set()
    assert exited_s < 5.0, exited_s
