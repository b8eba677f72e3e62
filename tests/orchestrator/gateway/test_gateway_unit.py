"""The gateway through Litestar's test client (or on a real uvicorn server where a client
must hang up), against fake rank 0s: a real HTTP server whose answers each test scripts as
a function from httpx.Request to httpx.Response."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from litestar.testing import AsyncTestClient

from contract import launch_secret
from orchestrator.gateway import app as gateway_app
from orchestrator.supervision.metrics import OrchestratorMetrics
from orchestrator.supervision.state import GangState
from testkit.fake_rank0 import KEY, FakeView, Handler, fake_rank0, sse, status
from testkit.raw_http import on_uvicorn

BODY = {"model": "m", "prompt": "Hi", "max_tokens": 2}


@pytest.fixture
def gateway() -> Iterator[Callable[..., Any]]:
    """(view, handler for rank 0's requests, api key) -> test client and metrics."""
    with contextlib.ExitStack() as servers:

        def make(
            view: FakeView, handler: Handler, api_key: str | None = None,
            request_timeout_s: float = 5.0,
        ) -> Any:
            view.base_url = servers.enter_context(fake_rank0(handler))
            metrics = OrchestratorMetrics()
            app = gateway_app.create_app(
                view, status, metrics, api_key=api_key, request_timeout_s=request_timeout_s
            )
            return AsyncTestClient(app=app), metrics

        yield make


def ok(request: httpx.Request) -> httpx.Response:
    return httpx.Response(200, json={"served_by": request.url.host})


def retried(metrics: OrchestratorMetrics) -> float:
    return metrics.registry.get_sample_value("orchestrator_requests_retried_total") or 0.0


async def test_health_follows_the_state(gateway: Callable[..., Any]) -> None:
    """/health is 200 when ready and 503 otherwise, with the state and reason."""
    view = FakeView()
    client, _ = gateway(view, ok)
    async with client:
        assert (await client.get("/health")).status_code == 200
        view.to(GangState.RESTARTING, reason="rank_crashed: rank 1")
        reply = await client.get("/health")
        assert reply.status_code == 503
        assert reply.json() == {"status": "restarting", "reason": "rank_crashed: rank 1"}


async def test_api_key_guards_v1_and_status_not_health(gateway: Callable[..., Any]) -> None:
    """Without the key /v1 and /status are 401 in OpenAI's shape; /health stays open."""
    client, _ = gateway(FakeView(), ok, api_key=KEY)
    async with client:
        for path in ("/v1/models", "/status"):
            reply = await client.get(path)
            assert reply.status_code == 401
            assert reply.json()["error"]["code"] == "invalid_api_key"
        assert (await client.get("/health")).status_code == 200
        wrong = await client.get("/v1/models", headers={"Authorization": "Bearer k-124"})
        assert wrong.status_code == 401 and wrong.json()["error"]["message"] == "incorrect API key"
        authorised = await client.get("/v1/models", headers={"Authorization": f"Bearer {KEY}"})
        assert authorised.json() == {"served_by": "rank0-l1"}


async def test_rank_0_gets_the_request_as_sent_but_not_the_api_key(
    gateway: Callable[..., Any],
) -> None:
    """Path, query, body and the client's headers reach rank 0; the gateway's key does not."""
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return ok(request)

    view = FakeView()
    client, _ = gateway(view, handler, api_key=KEY)
    headers = {"Authorization": f"Bearer {KEY}", "X-Trace": "t1"}
    async with client:
        reply = await client.post("/v1/chat/completions?a=1", json=BODY, headers=headers)
        bare = await client.post("/v1/completions", content=b"{}",
                                 headers={"Authorization": f"Bearer {KEY}"})
    assert reply.status_code == bare.status_code == 200
    request, plain = seen
    assert (request.url.path, request.url.query) == ("/v1/chat/completions", b"a=1")
    assert json.loads(request.content) == BODY
    assert request.headers["x-trace"] == "t1" and "authorization" not in request.headers
    assert request.headers["content-type"] == "application/json"
    assert "content-type" not in plain.headers  # the proxy adds none of its own
    assert view.wakes == 2  # each request first woke the idle workers


async def test_rank_0_gets_its_launch_secret_from_the_gateway_never_a_clients(
    gateway: Callable[..., Any],
) -> None:
    """Every request to rank 0 carries the secret of the launch it goes to; one a client
    sends is dropped (the gateway's replaces it), so none reaches rank 0 around the key."""
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return ok(request)

    view = FakeView()
    client, _ = gateway(view, handler)
    async with client:
        await client.get("/v1/models")
        await client.post("/v1/completions", json=BODY,
                          headers={launch_secret.HEADER: "from-a-client"})
        view.to(GangState.READY, launch="l2")
        await client.post("/v1/chat/completions", json=BODY)
    assert [r.headers.get_list(launch_secret.HEADER) for r in seen] == [
        ["secret-l1"], ["secret-l1"], ["secret-l2"]
    ]


async def test_a_request_held_during_a_restart_goes_to_the_next_gang(
    gateway: Callable[..., Any],
) -> None:
    """While restarting the request waits; once a gang is ready it is forwarded there."""
    view = FakeView()
    view.to(GangState.RESTARTING)
    client, _ = gateway(view, ok)
    async with client:
        # The test client blocks this loop while a request runs: the gang gets ready meanwhile
        # (timed from here: starting the client can take longer than the wait on a busy machine).
        started = time.monotonic()
        threading.Timer(0.3, view.to, (GangState.READY, "l2")).start()
        reply = await client.post("/v1/completions", json=BODY)
    assert time.monotonic() - started >= 0.3
    assert reply.status_code == 200 and reply.json() == {"served_by": "rank0-l2"}


async def test_a_request_held_past_request_timeout_s_gets_503(
    gateway: Callable[..., Any],
) -> None:
    """No gang ready within request_timeout_s of its arrival: 503 cluster_unavailable with
    Retry-After 5, then and not much later."""
    view = FakeView()
    view.to(GangState.RESTARTING)
    client, _ = gateway(view, ok, request_timeout_s=0.5)
    async with client:
        started = time.monotonic()
        reply = await client.post("/v1/completions", json=BODY)
    waited = time.monotonic() - started
    assert 0.5 <= waited < 1.5, waited
    assert reply.status_code == 503 and reply.headers["retry-after"] == "5"
    assert reply.json()["error"]["code"] == "cluster_unavailable"


def test_a_held_request_whose_client_left_is_dropped_not_forwarded(
    gateway: Callable[..., Any],
) -> None:
    """While restarting, a client gives up on its held request: the next gang never gets
    it; a request sent then is forwarded as usual."""
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return ok(request)

    view = FakeView()
    view.to(GangState.RESTARTING)
    client, _ = gateway(view, handler)
    # A real server: a client that hangs up is seen as one (the test client cannot hang up).
    with on_uvicorn(client.app) as (host, port):
        url = f"http://{host}:{port}"
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f"{url}/v1/completions", json=BODY, timeout=0.5)
        time.sleep(0.3)  # the gateway reads the hang-up
        view.to(GangState.READY, "l2")
        time.sleep(0.5)  # a forward, if one were still waiting, would be on its way
        assert seen == []
        after = httpx.post(f"{url}/v1/completions", json=BODY, timeout=5)
    assert after.json() == {"served_by": "rank0-l2"} and len(seen) == 1


@pytest.mark.parametrize("failure", ["503 stopping", "engine_error event"])
async def test_a_request_the_dying_gang_could_not_start_is_resent(
    gateway: Callable[..., Any], failure: str
) -> None:
    """Rank 0 answers 503 (stopping) or opens the stream with an engine_error event: the
    gateway resends to the next launch and the client only sees that one's answer."""
    view = FakeView()

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.host == "rank0-l1":
            view.to(GangState.READY, launch="l2")
            if failure == "503 stopping":
                return httpx.Response(503, json={"error": {"message": "stopping"}})
            event = b'data: {"error": {"message": "x", "type": "api_error",'
            event += b' "code": "engine_error"}}\n\n'
            return sse(event, b"data: [DONE]\n\n")
        return sse(b'data: {"ok": 2}\n\n', b"data: [DONE]\n\n")

    client, metrics = gateway(view, handler)
    async with client:
        reply = await client.post("/v1/completions", json={**BODY, "stream": True})
    assert reply.text == 'data: {"ok": 2}\n\ndata: [DONE]\n\n'
    assert retried(metrics) == 1


async def test_a_resend_waits_for_a_launch_other_than_the_one_that_failed(
    gateway: Callable[..., Any],
) -> None:
    """Rank 0 of l1 answers 503 while the view still shows l1 ready (for 0.2 s): the gateway
    does not resend to l1 but waits for the next launch."""
    view = FakeView()
    hosts: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        hosts.append(request.url.host)
        if request.url.host == "rank0-l1":
            threading.Timer(0.2, view.to, (GangState.READY, "l2")).start()
            return httpx.Response(503, json={"error": {"message": "stopping"}})
        return ok(request)

    client, metrics = gateway(view, handler)
    async with client:
        reply = await client.post("/v1/completions", json=BODY)
    assert reply.json() == {"served_by": "rank0-l2"}
    assert hosts == ["rank0-l1", "rank0-l2"] and retried(metrics) == 1


async def test_a_stream_cut_after_its_first_token_ends_with_an_error_event(
    gateway: Callable[..., Any],
) -> None:
    """Rank 0 dies mid-stream: the client gets what was sent, an error event, then DONE."""
    first = b'data: {"choices": [{"text": "Hel"}]}\n\n'

    def handler(request: httpx.Request) -> httpx.Response:
        return sse(first, cut=True)

    client, metrics = gateway(FakeView(), handler)
    async with client:
        reply = await client.post("/v1/completions", json={**BODY, "stream": True})
    assert reply.content.startswith(first)
    assert reply.headers["content-type"].startswith("text/event-stream")
    assert '"code":"stream_interrupted"' in reply.text and reply.text.endswith("data: [DONE]\n\n")
    failed = metrics.registry.get_sample_value(
        "orchestrator_requests_failed_total", {"reason": "stream_cut"}
    )
    assert failed == 1


async def test_a_failed_cluster_answers_503_with_retry_after(gateway: Callable[..., Any]) -> None:
    """Budget spent: 503, code cluster_failed, the reason, Retry-After 60."""
    view = FakeView()
    view.to(GangState.FAILED, reason="more than 5 restarts within 600 s")
    client, _ = gateway(view, ok)
    async with client:
        reply = await client.post("/v1/completions", json=BODY)
    assert reply.status_code == 503 and reply.headers["retry-after"] == "60"
    error = reply.json()["error"]
    assert error["code"] == "cluster_failed" and "more than 5 restarts" in error["message"]


async def test_a_request_during_shutdown_is_refused_at_once(gateway: Callable[..., Any]) -> None:
    """Draining (the orchestrator is stopping): 503 shutting_down, Retry-After 5, no wait."""
    view = FakeView()
    view.to(GangState.RESTARTING)
    view.draining = True
    client, metrics = gateway(view, ok)
    async with client:
        started = time.monotonic()
        reply = await client.post("/v1/completions", json=BODY)
    assert time.monotonic() - started < 1.0
    assert reply.status_code == 503 and reply.headers["retry-after"] == "5"
    assert reply.json()["error"]["code"] == "shutting_down"
    failed = metrics.registry.get_sample_value(
        "orchestrator_requests_failed_total", {"reason": "unavailable"}
    )
    assert failed == 1


async def test_an_unknown_route_is_404_in_openai_shape(gateway: Callable[..., Any]) -> None:
    """Litestar's own errors come back as OpenAI error objects."""
    client, _ = gateway(FakeView(), ok)
    async with client:
        reply = await client.get("/nope")
    assert reply.status_code == 404
    assert reply.json()["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize(
    ("method", "path", "allowed"),
    [("POST", "/v1/models", "GET"), ("GET", "/v1/chat/completions", "POST"),
     ("DELETE", "/v1/completions", "POST")],
)
async def test_a_wrong_method_is_405_with_allow_and_never_reaches_rank_0(
    gateway: Callable[..., Any], method: str, path: str, allowed: str
) -> None:
    """405 in OpenAI's shape, code method_not_allowed, Allow naming the route's methods."""
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return ok(request)

    client, _ = gateway(FakeView(), handler, api_key=KEY)
    async with client:
        reply = await client.request(method, path, headers={"Authorization": f"Bearer {KEY}"})
    assert reply.status_code == 405 and not seen
    assert {m.strip() for m in reply.headers["allow"].split(",")} == {allowed, "OPTIONS"}
    error = reply.json()["error"]
    assert error["code"] == "method_not_allowed" and allowed in error["message"]


@pytest.mark.parametrize(
    ("path", "allowed"), [("/v1/chat/completions", "POST"), ("/v1/completions", "POST"),
                          ("/v1/models", "GET")],
)
async def test_options_advertises_only_the_methods_the_route_serves(
    gateway: Callable[..., Any], path: str, allowed: str
) -> None:
    """OPTIONS (no key needed: it names methods only) lists the route's method and OPTIONS;
    each method it lists is then not a 405."""
    client, _ = gateway(FakeView(), ok, api_key=KEY)
    async with client:
        reply = await client.options(path)
        assert reply.status_code == 204
        methods = {m.strip() for m in reply.headers["allow"].split(",")}
        assert methods == {allowed, "OPTIONS"}
        for method in methods - {"OPTIONS"}:
            answer = await client.request(method, path, json=BODY,
                                          headers={"Authorization": f"Bearer {KEY}"})
            assert answer.status_code == 200


async def test_an_unknown_v1_route_is_404_from_the_gateway(gateway: Callable[..., Any]) -> None:
    """Only OpenAI's routes are forwarded; another /v1 path is a 404 coded not_found."""
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return ok(request)

    client, _ = gateway(FakeView(), handler)
    async with client:
        reply = await client.post("/v1/embeddings", json=BODY)
    assert reply.status_code == 404 and not seen
    assert reply.json()["error"]["code"] == "not_found"


async def test_a_body_over_8_mib_is_413_and_never_reaches_rank_0(
    gateway: Callable[..., Any],
) -> None:
    """The gateway's own limit (docs: 8 MiB): one byte over is refused in OpenAI's shape
    without a word to rank 0; exactly 8 MiB is forwarded."""
    seen: list[int] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(len(request.content))
        return ok(request)

    client, _ = gateway(FakeView(), handler)
    limit = 8 * 1024 * 1024
    async with client:
        over = await client.post("/v1/completions", content=b" " * (limit + 1),
                                 headers={"content-type": "application/json"})
        at = await client.post("/v1/completions", content=b" " * limit,
                               headers={"content-type": "application/json"})
    assert over.status_code == 413, over.text
    assert over.json()["error"]["type"] == "invalid_request_error", over.json()
    assert at.status_code == 200 and seen == [limit], (at.text, seen)
