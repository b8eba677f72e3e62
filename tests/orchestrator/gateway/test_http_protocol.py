"""The gateway's connection limits on a real uvicorn server: half-sent requests are closed
after the head deadline while others are served; oversized heads are refused."""

from __future__ import annotations

import socket

import httpx

from contract.http_limits import raise_file_limit, server_options
from orchestrator.gateway import app as gateway_app
from orchestrator.gateway.http_protocol import HttpProtocol
from orchestrator.supervision.metrics import OrchestratorMetrics
from testkit.fake_rank0 import FakeView, fake_rank0, status
from testkit.raw_http import HALF_HEAD, closed_by_server, half_sent, on_uvicorn

DEADLINE_S = 1.0


class QuickHead(HttpProtocol):
    head_timeout_s = DEADLINE_S  # the gateway's own, shortened for the test


def ok(request: httpx.Request) -> httpx.Response:
    return httpx.Response(200, json={"id": "c", "choices": []})


def test_half_sent_heads_are_closed_while_others_are_served() -> None:
    """200 connections holding half a request head: /health and a chat request still get
    answers, and the gateway closes all 200 once the head deadline passes."""
    raise_file_limit()
    view = FakeView()
    with fake_rank0(ok) as rank0:
        view.base_url = rank0
        app = gateway_app.create_app(view, status, OrchestratorMetrics(), api_key=None,
                                     request_timeout_s=5.0)
        with on_uvicorn(app, http=QuickHead, **server_options()) as (host, port):
            held = half_sent(host, port, 200, HALF_HEAD)
            base = f"http://{host}:{port}"
            assert httpx.get(f"{base}/health", timeout=5).status_code == 200
            chat = httpx.post(f"{base}/v1/chat/completions", timeout=5,
                              json={"model": "m", "messages": []})
            assert chat.status_code == 200, chat.text
            closed = closed_by_server(held, DEADLINE_S + 2.0)
            assert closed == 200


def test_a_head_over_64_kib_is_refused_with_431() -> None:
    """A request head larger than MAX_HEAD_BYTES gets 431 and the connection is closed."""
    view = FakeView()
    app = gateway_app.create_app(view, status, OrchestratorMetrics(), api_key=None,
                                 request_timeout_s=5.0)
    with on_uvicorn(app, http=HttpProtocol) as (host, port):
        sock = socket.create_connection((host, port), timeout=5)
        head = b"GET /health HTTP/1.1\r\nHost: x\r\n" + b"X-Pad: " + b"a" * 70_000 + b"\r\n"
        sock.sendall(head)
        reply = b""
        while chunk := sock.recv(65536):
            reply += chunk
        sock.close()
        assert reply.startswith(b"HTTP/1.1 431"), reply[:100]
