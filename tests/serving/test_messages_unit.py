"""Anthropic Messages requests translated for the chat template and the tool parsers, and
the stop reasons, without a model."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import msgspec
import pytest
from mlx_lm.tool_parsers import json_tools

from contract.anthropic_schemas import MessagesRequest
from contract.openai_errors import ApiError
from contract.openai_schemas import FunctionCall, ToolCall
from serving.api.messages import stop_reason, tool_use
from serving.api.messages_prompt import check_request, max_tokens, template_messages, tool_plan
from serving.api.state import ServedModel
from serving.engine.requests import Finished

TOOL = {"name": "get_weather", "input_schema": {"type": "object"}}


def request(**fields: Any) -> MessagesRequest:
    body = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}],
            **fields}
    return msgspec.convert(body, MessagesRequest)


def test_turns_blocks_and_tool_results_become_template_messages() -> None:
    """system first; an assistant's tool_use is its call (arguments an object); a user's
    tool_result is a tool turn before the user's own text."""
    req = request(system=[{"type": "text", "text": "Be brief."}], messages=[
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": [
            {"type": "text", "text": "Checking."},
            {"type": "tool_use", "id": "toolu_1", "name": "get_weather",
             "input": {"city": "Paris"}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1",
             "content": [{"type": "text", "text": "21 C"}]},
            {"type": "text", "text": "Thanks"}]},
    ])
    assert template_messages(req, {}) == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": "Checking.", "tool_calls": [
            {"id": "toolu_1", "type": "function",
             "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
        {"role": "tool", "tool_call_id": "toolu_1", "content": "21 C"},
        {"role": "user", "content": "Thanks"},
    ]


def test_tool_choice_maps_onto_the_same_plan() -> None:
    """any and a named tool open the call; none drops the tools; disable_parallel_tool_use
    keeps one call; the tools reach the template in OpenAI's function shape."""
    tok = SimpleNamespace(has_tool_calling=True, tool_call_start=json_tools.tool_call_start,
                          tool_call_end=json_tools.tool_call_end)
    auto = tool_plan(request(tools=[TOOL]), tok)
    assert not auto.open_call and auto.parallel
    assert auto.tools == [{"type": "function", "function": {
        "name": "get_weather", "parameters": {"type": "object"}}}]
    assert tool_plan(request(tools=[TOOL], tool_choice={"type": "any"}), tok).open_call
    named = tool_plan(request(tools=[TOOL], tool_choice={"type": "tool", "name": "get_weather"}),
                      tok)
    assert named.open_call and named.tools
    assert tool_plan(request(tools=[TOOL], tool_choice={"type": "none"}), tok).tools is None
    single = tool_plan(
        request(tools=[TOOL], tool_choice={"type": "auto", "disable_parallel_tool_use": True}),
        tok)
    assert not single.parallel
    with pytest.raises(ApiError) as caught:
        tool_plan(request(tools=[TOOL], tool_choice={"type": "tool", "name": "nope"}), tok)
    assert caught.value.body.param == "tool_choice.name"


def test_stop_reasons_and_tool_use_blocks() -> None:
    call = ToolCall("call_abc", FunctionCall("get_weather", '{"city": "Paris"}'))
    assert stop_reason(Finished("length", 3, 8), []).stop_reason == "max_tokens"
    assert stop_reason(Finished("stop", 3, 2), [call]).stop_reason == "tool_use"
    cut = stop_reason(Finished("stop", 3, 2, "\n\n"), [])
    assert (cut.stop_reason, cut.stop_sequence) == ("stop_sequence", "\n\n")
    assert stop_reason(Finished("stop", 3, 2), []).stop_reason == "end_turn"
    block = tool_use(call)
    assert (block.id, block.input) == ("toolu_abc", {"city": "Paris"})


def test_the_served_model_is_checked_and_max_tokens_is_a_ceiling() -> None:
    """An unknown model is a 404; max_tokens is capped by the server's limit and by the
    context the prompt leaves, never below 1."""
    with pytest.raises(ApiError) as caught:
        check_request(request(model="claude-x"), "m")
    assert caught.value.status == 404
    with pytest.raises(ApiError) as caught:
        check_request(request(max_tokens=0), "m")
    assert caught.value.body.param == "max_tokens"
    model = ServedModel(None, context_length=1000, vocab_size=10)
    assert max_tokens(request(max_tokens=32000), 100, model, 4096) == 900
    assert max_tokens(request(max_tokens=32000), 100, model, 512) == 512
    assert max_tokens(request(max_tokens=8), 100, model, 512) == 8
