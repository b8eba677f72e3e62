"""The gateway's Anthropic Messages routes against a fake rank 0: the key as x-api-key, errors
and a cut stream in Anthropic's shape (the real rank 0 behind a gateway: test_openapi_fuzz);
and a cut Responses stream in its own."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from litestar.testing import AsyncTestClient
from openai.types.responses import ResponseErrorEvent

from orchestrator.gateway import app as gateway_app
from orchestrator.supervision.metrics import OrchestratorMetrics
from tests.orchestrator.test_gateway_unit import KEY, FakeView, Handler, fake_rank0, sse, status

BODY = {"model": "m", "max_tokens": 2, "messages": [{"role": "user", "content": "Hi"}]}


@pytest.fixture
def gateway() -> Iterator[Callable[..., AsyncTestClient[Any]]]:
    """(handler for rank 0's requests, api key) -> a test client of the gateway."""
    with contextlib.ExitStack() as servers:

        def make(handler: Handler, api_key: str | None = None) -> AsyncTestClient[Any]:
            view = FakeView()
            view.base_url = servers.enter_context(fake_rank0(handler))
            app = gateway_app.create_app(
                view, status, OrchestratorMetrics(), api_key=api_key, request_timeout_s=5.0
            )
            return AsyncTestClient(app=app)

        yield make


async def test_x_api_key_or_bearer_and_anthropic_errors(
    gateway: Callable[..., AsyncTestClient[Any]],
) -> None:
    """x-api-key opens /v1 as Bearer does, and never reaches rank 0; a missing or wrong key
    on /v1/messages is Anthropic's authentication_error, on the OpenAI routes OpenAI's."""
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json={"input_tokens": 3})

    client = gateway(handler, api_key=KEY)
    async with client:
        for headers in ({"x-api-key": KEY}, {"Authorization": f"Bearer {KEY}"}):
            reply = await client.post("/v1/messages/count_tokens", json=BODY, headers=headers)
            assert reply.json() == {"input_tokens": 3}
        assert all("x-api-key" not in r.headers and "authorization" not in r.headers
                   for r in seen)
        for headers in ({}, {"x-api-key": "k-wrong"}):
            refused = await client.post("/v1/messages", json=BODY, headers=headers)
            assert refused.status_code == 401
            assert refused.json()["type"] == "error"
            assert refused.json()["error"]["type"] == "authentication_error"
        openai = await client.post("/v1/completions", json={}, headers={"x-api-key": "no"})
        assert openai.json()["error"]["code"] == "invalid_api_key"
        unknown = await client.get("/v1/messages/nope", headers={"x-api-key": KEY})
        assert unknown.status_code == 404
        assert unknown.json()["error"]["type"] == "not_found_error"


async def test_a_cut_messages_stream_ends_with_anthropic_error_event(
    gateway: Callable[..., AsyncTestClient[Any]],
) -> None:
    """Rank 0 dies mid-stream: the client gets what was sent, then Anthropic's error event
    (no OpenAI [DONE])."""
    first = b'event: message_start\ndata: {"type": "message_start"}\n\n'
    client = gateway(lambda request: sse(first, cut=True))
    async with client:
        reply = await client.post("/v1/messages", json={**BODY, "stream": True})
    assert reply.content.startswith(first)
    name, data = reply.text[len(first):].strip().split("\n")
    assert name == "event: error" and "[DONE]" not in reply.text
    error = json.loads(data.removeprefix("data: "))
    assert error["type"] == "error" and error["error"]["type"] == "api_error"


async def test_a_cut_responses_stream_ends_with_the_responses_error_event(
    gateway: Callable[..., AsyncTestClient[Any]],
) -> None:
    """On /v1/responses a stream cut mid-way ends with the Responses API's `error` event
    (named, OpenAI's SDK reads it as a ResponseErrorEvent), not chat's [DONE]."""
    first = b'event: response.created\ndata: {"type": "response.created"}\n\n'
    client = gateway(lambda request: sse(first, cut=True), api_key=KEY)
    async with client:
        reply = await client.post(
            "/v1/responses", json={"model": "m", "input": "Hi", "stream": True},
            headers={"Authorization": f"Bearer {KEY}"},
        )
    assert reply.content.startswith(first)
    name, data = reply.text[len(first):].strip().split("\n")
    assert name == "event: error" and "[DONE]" not in reply.text
    event = ResponseErrorEvent.model_validate_json(data.removeprefix("data: "))
    assert event.code == "stream_interrupted"
