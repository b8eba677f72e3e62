"""`orchestrator bench` refuses a cluster that is not ready, and sums up streams rightly."""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from orchestrator.config import check_cluster_file
from orchestrator.loadgen.command import EXIT_NOT_READY, BenchOptions, bench, prompt_text
from orchestrator.loadgen.report import build_report
from orchestrator.loadgen.streams import StreamTimes
from orchestrator.state_file import ClusterState, own_start_time, state_path, write_state
from testkit.orchestrator_process import write_cluster

NODES = [{"name": "a", "ip": "127.0.0.1"}]


Answers = dict[str, tuple[int, dict[str, object]]]
RESTARTING: Answers = {"/health": (503, {"status": "restarting",
                                         "reason": "rank 1 crashed (SIGKILL)"})}
WANTS_KEY: Answers = {"/health": (200, {"status": "ready", "reason": ""}),
                      "/v1/models": (401, {"error": {"message": "missing API key"}})}


@contextlib.contextmanager
def serving(handler: type[BaseHTTPRequestHandler]) -> Iterator[str]:
    """`handler` on a real HTTP server on 127.0.0.1, in a thread; yields its URL."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@contextlib.contextmanager
def stub_gateway(answers: Answers) -> Iterator[str]:
    """A gateway answering GETs as scripted (404 for anything else); yields its URL."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            status, body = answers.get(self.path, (404, {}))
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(json.dumps(body).encode())

        def log_message(self, *args: object) -> None:
            return None

    with serving(Handler) as url:
        yield url


def running_at(tmp_path: Path, url: str) -> Path:
    """A cluster.toml whose state file names this process as its orchestrator, at `url`."""
    config = write_cluster(tmp_path, "bundled:smollm2-135m-instruct", NODES,
                           api={"api_key_env": "BENCH_TEST_KEY_UNSET"})
    spec, _ = check_cluster_file(config)
    write_state(state_path(spec), ClusterState(
        cluster=spec.cluster.name, config=str(config), orchestrator_pid=os.getpid(),
        orchestrator_started=own_start_time(), api_url=url,
        api_key_env="BENCH_TEST_KEY_UNSET",
    ))
    return config


def test_refuses_when_not_running(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """No state file: exit 2, and the JSON names the state and what to do."""
    config = write_cluster(tmp_path, "bundled:smollm2-135m-instruct", NODES)
    assert bench(config, BenchOptions(), as_json=True) == EXIT_NOT_READY
    answer = json.loads(capsys.readouterr().out)
    assert answer["state"] == "not_running" and "orchestrator up" in answer["reason"]


def test_refuses_while_restarting(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A live orchestrator whose /health is 503: exit 2, naming its state and reason; no
    request is sent."""
    with stub_gateway(RESTARTING) as url:
        config = running_at(tmp_path, url)
        assert bench(config, BenchOptions(), as_json=False) == EXIT_NOT_READY
    said = capsys.readouterr()
    assert said.out == ""
    assert "is restarting (rank 1 crashed (SIGKILL))" in said.err and "READY" in said.err


def test_refuses_without_the_key(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Ready, but the gateway wants a key this shell does not have: exit 2, naming the
    variable to set."""
    with stub_gateway(WANTS_KEY) as url:
        config = running_at(tmp_path, url)
        assert bench(config, BenchOptions(), as_json=True) == EXIT_NOT_READY
    answer = json.loads(capsys.readouterr().out)
    assert "set $BENCH_TEST_KEY_UNSET" in answer["reason"]


def test_report_from_stream_times() -> None:
    """Aggregate tokens/s over the wall time; TTFT and gaps from the streams that finished;
    a failed stream counted as an error with its message."""
    ok = StreamTimes(started=0.0, arrivals=[0.5, 0.6, 0.8, 1.0], prompt_tokens=70,
                     completion_tokens=4)
    slow = StreamTimes(started=0.0, arrivals=[1.5, 1.6])
    failed = StreamTimes(started=0.0, error="HTTP 503: restarting")
    report = build_report([ok, slow, failed], 2.0, cluster="c", url="u", model="m",
                          max_tokens=4, prompt_tokens=64)
    assert report.tokens == 6 and report.tokens_per_s == 3.0
    assert report.errors == 1 and report.error_messages == ["HTTP 503: restarting"]
    assert (report.ttft_s.p50, report.ttft_s.max) == (0.5, 1.5)
    assert report.inter_token_s.max == pytest.approx(0.2)
    assert report.prompt_tokens == 70


def test_prompts_differ_from_the_first_word() -> None:
    """No two streams share a prefix (no prefix-cache hit); the length follows the ask."""
    first, second = prompt_text(200, 0), prompt_text(200, 1)
    assert first.split()[0] != second.split()[0]
    assert 180 <= len(first.split()) <= 220


class ChatLog:
    """What a streaming stub gateway saw: each chat's max_tokens in arrival order, and the
    most chats it was answering at once."""

    def __init__(self) -> None:
        self.max_tokens: list[int] = []
        self.running = self.most = 0
        self.lock = threading.Lock()


@contextlib.contextmanager
def streaming_gateway(log: ChatLog, gap_s: float) -> Iterator[str]:
    """A ready gateway whose chats stream max_tokens chunks, `gap_s` apart, with usage."""
    ready: Answers = {"/health": (200, {"status": "ready", "reason": ""}),
                      "/v1/models": (200, {"data": []})}

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            status, body = ready.get(self.path, (404, {}))
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            with log.lock:
                log.max_tokens.append(body["max_tokens"])
                log.running += 1
                log.most = max(log.most, log.running)
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Connection", "close")
            self.end_headers()
            chunks = [{"choices": [{"delta": {"content": "x"}}]}] * body["max_tokens"]
            for chunk in [*chunks, {"choices": [], "usage": {
                    "prompt_tokens": 9, "completion_tokens": body["max_tokens"]}}]:
                time.sleep(gap_s)
                self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                self.wfile.flush()
            self.wfile.write(b"data: [DONE]\n\n")
            with log.lock:
                log.running -= 1
            self.close_connection = True

        def log_message(self, *args: object) -> None:
            return None

    with serving(Handler) as url:
        yield url


def test_the_streams_run_at_once_after_one_uncounted_warm_up(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """4 streams of 5 tokens, 0.1 s apart: one 1-token warm-up first, alone and not in the
    report; then the 4 at once (the gateway answered 4 together, the wall time is about one
    stream's, not four)."""
    log = ChatLog()
    with streaming_gateway(log, gap_s=0.1) as url:
        config = running_at(tmp_path, url)
        assert bench(config, BenchOptions(streams=4, max_tokens=5, prompt_tokens=16),
                     as_json=True) == 0
    report = json.loads(capsys.readouterr().out)
    assert log.max_tokens == [1, 5, 5, 5, 5] and log.most == 4
    assert report["streams"] == 4 and report["tokens"] == 20
    assert 0.5 <= report["wall_s"] < 1.2, report["wall_s"]  # 6 gaps of 0.1 s, not 24
