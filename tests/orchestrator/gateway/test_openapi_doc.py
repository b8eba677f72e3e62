"""The gateway's OpenAPI document: Litestar's generation from the /v1 handlers."""

from __future__ import annotations

from typing import Any

import pytest
from litestar.testing import AsyncTestClient

from orchestrator.gateway import app as gateway_app
from orchestrator.supervision.metrics import OrchestratorMetrics
from testkit.fake_rank0 import FakeView, status

OPERATIONS = {
    ("/v1/chat/completions", "post"): ("ChatCompletionRequest", "ChatCompletion"),
    ("/v1/completions", "post"): ("CompletionRequest", "Completion"),
    ("/v1/messages", "post"): ("MessagesRequest", "Message"),
    ("/v1/messages/count_tokens", "post"): ("CountTokensRequest", "TokenCount"),
    ("/v1/responses", "post"): ("ResponsesRequest", "Response"),
    ("/v1/models", "get"): (None, "ModelList"),
}
ANTHROPIC = {"/v1/messages", "/v1/messages/count_tokens"}  # errors in Anthropic's shape


async def document(api_key: str | None) -> dict[str, Any]:
    app = gateway_app.create_app(
        FakeView(), status, OrchestratorMetrics(), api_key=api_key, request_timeout_s=5.0
    )
    async with AsyncTestClient(app=app) as client:
        reply = await client.get("/openapi.json")
    assert reply.status_code == 200
    doc: dict[str, Any] = reply.json()
    return doc


def ref(content: dict[str, Any]) -> str:
    ref_: str = content["application/json"]["schema"]["$ref"]
    return ref_.removeprefix("#/components/schemas/")


@pytest.mark.parametrize("api_key", ["k", None], ids=["key", "no-key"])
async def test_the_document_covers_v1_with_bodies_and_openai_errors(api_key: str | None) -> None:
    """Every /v1 operation, its request and response bodies, errors as ErrorEnvelope (or
    Anthropic's on /v1/messages), the bearer and x-api-key schemes when a key is set;
    nothing else of the gateway."""
    doc = await document(api_key)
    assert doc["openapi"].startswith("3.1")
    assert set(doc["paths"]) == {path for path, _ in OPERATIONS}
    for (path, method), (request, response) in OPERATIONS.items():
        operation = doc["paths"][path][method]
        assert set(doc["paths"][path]) == {method}
        if request:
            assert ref(operation["requestBody"]["content"]) == request
        responses = operation["responses"]
        assert ref(responses["200"]["content"]) == response
        errors = {code for code in responses if code != "200"}
        assert "401" in errors and "503" in errors
        envelope = "AnthropicErrorEnvelope" if path in ANTHROPIC else "ErrorEnvelope"
        assert all(ref(responses[code]["content"]) == envelope for code in errors)
        either = [{"bearer": []}, {"x-api-key": []}]
        assert operation.get("security") == (either if api_key else None)
    for path in ("/v1/completions", "/v1/messages", "/v1/responses"):
        streamed = doc["paths"][path]["post"]["responses"]["200"]["content"]
        assert "text/event-stream" in streamed
    event = doc["paths"]["/v1/messages"]["post"]["responses"]["200"]["content"][
        "text/event-stream"]["schema"]
    assert event["required"] == ["event", "data"]
    kinds = {ref_["$ref"].rsplit("/", 1)[1]
             for ref_ in event["properties"]["data"]["contentSchema"]["oneOf"]}
    assert {"MessageStart", "ContentBlockDelta", "MessageDelta", "MessageStop"} <= kinds
    event = doc["paths"]["/v1/responses"]["post"]["responses"]["200"]["content"][
        "text/event-stream"]["schema"]
    assert event["required"] == ["event", "data"]
    kinds = {ref_["$ref"].rsplit("/", 1)[1]
             for ref_ in event["properties"]["data"]["contentSchema"]["oneOf"]}
    assert {"Lifecycle", "OutputItemEvent", "TextDeltaEvent", "ArgumentsDeltaEvent"} <= kinds
    schemes = doc["components"].get("securitySchemes")
    assert schemes == ({
        "bearer": {"type": "http", "scheme": "bearer"},
        "x-api-key": {"type": "apiKey", "name": "x-api-key", "in": "header"},
    } if api_key else None)


def one_ofs(node: Any) -> list[list[dict[str, Any]]]:
    """Every `oneOf` list in the document, nested ones too."""
    found: list[list[dict[str, Any]]] = []
    if isinstance(node, dict):
        if isinstance(node.get("oneOf"), list):
            found.append(node["oneOf"])
        for value in node.values():
            found += one_ofs(value)
    elif isinstance(node, list):
        for value in node:
            found += one_ofs(value)
    return found


async def test_each_union_of_objects_tells_its_members_apart_by_type() -> None:
    """A value can match one member of a `oneOf` only: where the members are objects, each
    names its own `type` values. (Responses' events once all had `type: string`, so a
    content_part event also matched function_call_arguments.done and schemathesis failed.)"""
    doc = await document(None)
    schemas = doc["components"]["schemas"]
    checked = 0
    for members in one_ofs(doc):
        names = [m["$ref"].rsplit("/", 1)[1] for m in members if "$ref" in m]
        objects = [schemas[name] for name in names if "type" in schemas[name].get("properties", {})]
        if len(objects) < 2:
            continue
        seen: set[str] = set()
        for name, schema in zip(names, objects, strict=True):
            kind = schema["properties"]["type"]
            values = {kind["const"]} if "const" in kind else set(kind.get("enum", []))
            assert values, f"{name}.type names no values: {kind}"
            assert not values & seen, f"{name}.type shares {values & seen} with another member"
            seen |= values
        checked += 1
    assert checked >= 8  # the stream events of both APIs, their blocks, deltas and items
