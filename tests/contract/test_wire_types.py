"""The contract's error table and shapes, and the linktest result line, on their own."""

from __future__ import annotations

import msgspec

from contract.anthropic_schemas import (
    AnthropicErrorEnvelope,
    ContentBlockStart,
    TextBlock,
    anthropic_event,
    error_payload,
)
from contract.linktest import (
    BandwidthRow,
    Latency,
    LinkFigure,
    LinktestResult,
    parse_result_line,
    result_line,
)
from contract.openai_errors import ApiError, ErrorEnvelope


def test_one_table_gives_both_apis_their_types() -> None:
    """A 503 is server_error/service_unavailable in OpenAI's shape and overloaded_error in
    Anthropic's, from either server; a raiser's code wins over the default; the field at
    fault leads Anthropic's message."""
    busy = ApiError(503, "model is loading")
    assert (busy.body.type, busy.body.code) == ("server_error", "service_unavailable")
    assert ApiError(503, "x", code="cluster_failed").body.code == "cluster_failed"
    openai = error_payload(busy, "/v1/chat/completions")
    assert isinstance(openai, ErrorEnvelope) and openai.error is busy.body
    anthropic = error_payload(ApiError(400, "must be >= 1", param="max_tokens"), "/v1/messages")
    assert msgspec.json.decode(msgspec.json.encode(anthropic)) == {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": "max_tokens: must be >= 1"},
    }
    assert isinstance(error_payload(busy, "/v1/messages/count_tokens"), AnthropicErrorEnvelope)
    assert ApiError(418, "teapot").body.type == "invalid_request_error"


def test_anthropic_events_are_named_by_their_type() -> None:
    event = anthropic_event(ContentBlockStart(0, TextBlock("")))
    name, data = event.decode().strip().split("\n")
    assert name == "event: content_block_start"
    assert msgspec.json.decode(data.removeprefix("data: ")) == {
        "type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}


def test_linktest_result_line_round_trips() -> None:
    """What rank 0 prints is what the orchestrator reads; other lines are not results."""
    result = LinktestResult(
        2, True, Latency(50.0, 90.0), [BandwidthRow(4096, 1e-4, 0.04, 0.04)],
        [LinkFigure(0, 1, 8 << 20, 0.01, 0.84), LinkFigure(1, 0, 8 << 20, 0.02, 0.42)],
    )
    assert parse_result_line(result_line(result)) == result
    assert parse_result_line("linktest: starting") is None
