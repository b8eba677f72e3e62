"""The gateway's bounds on what clients make it hold: bodies being read, their time, and
live-chart streams; each refused in its API's error shape. On a real uvicorn server."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import msgspec
import pytest

from orchestrator.gateway import app as gateway_app
from orchestrator.gateway import live
from orchestrator.gateway.http_protocol import HttpProtocol
from orchestrator.supervision.metrics import OrchestratorMetrics
from testkit.fake_rank0 import FakeView, fake_rank0, status
from testkit.raw_http import half_body, half_sent, on_uvicorn


def ok(request: httpx.Request) -> httpx.Response:
    return httpx.Response(200, json={"id": "x"})


@pytest.fixture
def served() -> Iterator[tuple[str, Any]]:
    """The gateway (no key) on uvicorn before a fake rank 0: its URL and its app."""
    view = FakeView()
    with fake_rank0(ok) as rank0:
        view.base_url = rank0
        app = gateway_app.create_app(view, status, OrchestratorMetrics(), api_key=None,
                                     request_timeout_s=5.0)
        with on_uvicorn(app, http=HttpProtocol) as (host, port):
            yield f"http://{host}:{port}", app


def test_bodies_being_read_are_bounded(served: tuple[str, Any]) -> None:
    """With every body slot taken by a slow upload, a POST gets 503 overloaded (Anthropic's
    overloaded_error on /v1/messages) and a GET still passes; a freed slot serves again."""
    url, app = served
    app.state.gateway.bodies.limit = 3
    host, port = url.removeprefix("http://").split(":")
    held = half_sent(host, int(port), 3, half_body("/v1/chat/completions"))
    try:
        httpx.get(f"{url}/health", timeout=5)  # the three are being read by now
        chat = httpx.post(f"{url}/v1/chat/completions", json={"model": "m"}, timeout=5)
        assert chat.status_code == 503 and chat.headers["retry-after"] == "1"
        assert chat.json()["error"]["code"] == "overloaded"
        message = httpx.post(f"{url}/v1/messages", json={"model": "m"}, timeout=5)
        assert message.status_code == 503
        assert message.json()["error"]["type"] == "overloaded_error"
        assert httpx.get(f"{url}/v1/models", timeout=5).status_code == 200
    finally:
        for sock in held:
            sock.close()
    assert httpx.post(f"{url}/v1/chat/completions", json={"model": "m"}, timeout=5).is_success


def test_a_body_that_does_not_arrive_in_time_is_408(served: tuple[str, Any]) -> None:
    """A body still incomplete after the body timeout gets 408 and the connection closes,
    giving its slot back."""
    url, app = served
    app.state.gateway.bodies.timeout_s = 0.5
    host, port = url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=5)
    sock.sendall(half_body("/v1/completions"))
    reply = b""
    while chunk := sock.recv(65536):
        reply += chunk
    sock.close()
    assert reply.startswith(b"HTTP/1.1 408"), reply[:200]
    assert b'"code":"request_timeout"' in reply
    assert app.state.gateway.bodies.reading == 0


def test_live_chart_streams_are_bounded(served: tuple[str, Any],
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Beyond MAX_WATCHERS open live-chart streams, another gets 429; one closing frees a place."""
    monkeypatch.setattr(live, "MAX_WATCHERS", 2)
    url, _ = served
    with (httpx.stream("GET", f"{url}/status/live", timeout=5) as one,
          httpx.stream("GET", f"{url}/status/live", timeout=5) as two):
        assert one.status_code == two.status_code == 200
        with httpx.stream("GET", f"{url}/status/live", timeout=5) as third:
            assert third.status_code == 429
            assert msgspec.json.decode(third.read())["error"]["type"] == "rate_limit_error"
    for _ in range(50):  # the closed streams' places come back as their generators end
        reply = httpx.get(f"{url}/health", timeout=5)
        with httpx.stream("GET", f"{url}/status/live", timeout=5) as again:
            if again.status_code == 200:
                break
        threading.Event().wait(0.1)
    assert again.status_code == 200 and reply.status_code == 200
