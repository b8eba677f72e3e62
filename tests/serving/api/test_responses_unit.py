"""The Responses API's translation without a model: input items and instructions as the chat
template's messages, tools and tool_choice onto the tool plan, the 400s, and the event
stream as the official openai SDK reads it."""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import msgspec
import pytest
from mlx_lm.tool_parsers import json_tools

from contract.openai_errors import ApiError
from contract.responses_schemas import ResponsesRequest
from serving.api.reasoning import ReasoningSplitter, ReasoningSyntax
from serving.api.responses import Answer, created, new_id
from serving.api.responses_events import ResponseBuild
from serving.api.responses_prompt import (
    check_request,
    max_tokens,
    seal_reasoning,
    template_kwargs,
    template_messages,
    text_format,
)
from serving.api.responses_tools import tool_plan, tool_set
from serving.api.state import ServedModel
from serving.api.tool_calls import ToolCallStream
from serving.api.validation import decode_body
from serving.engine.requests import Finished
from testkit.responses_sdk import accumulate, sse_events

WEATHER = {"type": "function", "name": "get_weather", "description": "Weather of a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}
SHELL_NS = {"type": "namespace", "name": "mcp", "description": "MCP tools", "tools": [
    {"type": "function", "name": "ls", "parameters": {"type": "object"}}]}
PATCH = {"type": "custom", "name": "apply_patch", "description": "Patch files",
         "format": {"type": "grammar", "syntax": "lark", "definition": "start: /.+/"}}
KEY = b"k" * 32
TOKENIZER = SimpleNamespace(
    has_tool_calling=True, tool_call_start=json_tools.tool_call_start,
    tool_call_end=json_tools.tool_call_end, tool_parser=json_tools.parse_tool_call,
)


def request(**fields: Any) -> ResponsesRequest:
    return msgspec.convert({"model": "m", "input": "hi", **fields}, ResponsesRequest)


def test_items_become_template_messages() -> None:
    """instructions and the leading developer message make one system message; calls join
    the assistant turn; outputs are tool turns; a reasoning item sent back (as our
    encrypted_content) is the next assistant turn's reasoning_content."""
    req = request(instructions="Be brief.", input=[
        {"type": "message", "role": "developer", "content": [
            {"type": "input_text", "text": "Use tools."}]},
        {"role": "user", "content": "Weather in Paris?"},
        {"type": "reasoning", "id": "rs_1", "summary": [],
         "encrypted_content": seal_reasoning(KEY, "Look it up.")},
        {"type": "function_call", "call_id": "call_1", "name": "get_weather",
         "arguments": '{"city": "Paris"}'},
        {"type": "function_call", "call_id": "call_2", "name": "ls", "namespace": "mcp",
         "arguments": "{}"},
        {"type": "function_call_output", "call_id": "call_1", "output": "21 C"},
        {"type": "message", "role": "assistant", "content": [
            {"type": "output_text", "text": "21 C.", "annotations": []}]},
    ])
    assert template_messages(req, KEY) == [
        {"role": "system", "content": "Be brief.\n\nUse tools."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "reasoning_content": "Look it up.", "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": {"city": "Paris"}}},
            {"id": "call_2", "type": "function", "function": {"name": "mcp.ls", "arguments": {}}},
        ]},
        {"role": "tool", "tool_call_id": "call_1", "content": "21 C"},
        {"role": "assistant", "content": "21 C."},
    ]


@pytest.mark.parametrize(("fields", "param"), [
    ({"previous_response_id": "resp_1"}, "previous_response_id"),
    ({"background": True}, "background"),
    ({"text": {"format": {"type": "json_schema", "name": "x", "schema": {}}}}, "text.format"),
    ({"text": {"format": {"type": "json_object"}}}, "text.format"),
    ({"text": {"format": {"type": "json_schema", "name": "x"}}}, "text.format.schema"),
    ({"text": {"format": {"type": "yaml"}}}, "text.format.type"),
    ({"include": ["message.output_text.logprobs"]}, "include.0"),
    ({"reasoning": {"effort": "max"}}, "reasoning.effort"),
    ({"max_output_tokens": 0}, "max_output_tokens"),
    ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input.0.type"),
    ({"input": [{"role": "user", "content": [{"type": "input_image"}]}]},
     "input.0.content.0.type"),
    ({"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "{"}]},
     "input.0.arguments"),
    ({"input": [{"type": "reasoning", "summary": [], "encrypted_content": "forged"}]},
     "input.0.encrypted_content"),
])
def test_what_cannot_be_honoured_is_a_400_naming_the_field(
    fields: dict[str, Any], param: str
) -> None:
    """Stateful fields, structured outputs (until constrained decoding is wired), images,
    bad arguments and a reasoning item we did not make: 400s naming where."""
    with pytest.raises(ApiError) as caught:
        req = request(**fields)
        check_request(req, "m")
        template_messages(req, KEY)
    assert caught.value.status == 400 and caught.value.body.param == param, caught.value.body


def test_unknown_fields_are_refused_and_codex_fields_accepted() -> None:
    """Codex CLI's fields decode; a field nobody defines is the 400 naming it."""
    body = {"model": "m", "input": [], "instructions": "x", "tools": [], "tool_choice": "auto",
            "parallel_tool_calls": False, "reasoning": {"effort": "high", "summary": "auto"},
            "store": False, "stream": True, "include": ["reasoning.encrypted_content"],
            "prompt_cache_key": "k", "client_metadata": {"a": "b"},
            "text": {"verbosity": "low"}}
    check_request(decode_body(json.dumps(body).encode(), ResponsesRequest), "m")
    with pytest.raises(ApiError) as caught:
        decode_body(json.dumps({**body, "frobnicate": 1}).encode(), ResponsesRequest)
    assert caught.value.body.param == "frobnicate"


def test_tools_and_tool_choice() -> None:
    """function, namespace and custom tools reach the template, hosted ones do not; a named
    function opens the call; a hosted tool cannot be forced; only hosted tools + auto is an
    answer without tools."""
    tools = tool_set([WEATHER, SHELL_NS, PATCH, {"type": "web_search"}])
    names = [f["function"]["name"] for f in tools.functions]
    assert names == ["get_weather", "mcp.ls", "apply_patch"]
    forced = tool_plan(request(tool_choice={"type": "function", "name": "get_weather"}),
                       tools, TOKENIZER)
    assert forced.open_call and [t["function"]["name"] for t in forced.tools or []] == [
        "get_weather"]
    assert not tool_plan(request(parallel_tool_calls=False), tools, TOKENIZER).parallel
    with pytest.raises(ApiError) as caught:
        tool_plan(request(tool_choice={"type": "web_search"}), tools, TOKENIZER)
    assert caught.value.body.param == "tool_choice.type"
    hosted = tool_set([{"type": "web_search"}])
    assert tool_plan(request(tool_choice="auto"), hosted, TOKENIZER).tools is None


def test_max_output_tokens_is_a_ceiling() -> None:
    """Above the server's limit or the context left: capped, not refused; absent: the most."""
    model = ServedModel(TOKENIZER, context_length=100, vocab_size=10)
    assert max_tokens(request(max_output_tokens=32000), 10, model, 50) == 50
    assert max_tokens(request(max_output_tokens=32000), 80, model, 50) == 20
    assert max_tokens(request(), 10, model, 50) == 50
    assert max_tokens(request(max_output_tokens=5), 10, model, 50) == 5


def answer(req: ResponsesRequest, seal: bool = False) -> Answer:
    tools = tool_set(req.tools)
    build = ResponseBuild(created(req, "resp_1", 0), tools.item, new_id,
                          partial(seal_reasoning, KEY) if seal else None)
    splitter = ReasoningSplitter(ReasoningSyntax("think", "<think>", "</think>"))
    return Answer(build, splitter, ToolCallStream(TOKENIZER, tool_plan(req, tools, TOKENIZER)))


def test_the_stream_is_what_the_sdk_parses() -> None:
    """Reasoning, text, a function call and a namespaced one, fed in small pieces: every event
    validates as the SDK's type, in an order its accumulator takes, with sequence numbers
    0, 1, 2 ...; the final response carries the four items and the usage."""
    req = request(tools=[WEATHER, SHELL_NS])
    got = answer(req, seal=True)
    text = ('<think>Need weather.</think>Checking. <tool_call>\n{"name": "get_weather", '
            '"arguments": {"city": "Paris"}}\n</tool_call><tool_call>\n{"name": "mcp.ls", '
            '"arguments": {}}\n</tool_call>')
    raw = b"".join(got.build.start())
    for i in range(0, len(text), 5):
        raw += b"".join(got.feed(text[i:i + 5]))
    raw += b"".join(got.finish(Finished("stop", 7, 30)))
    events = sse_events(raw)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    final = accumulate(events)
    assert [item.type for item in final.output] == [
        "reasoning", "message", "function_call", "function_call"]
    reasoning, _, call, namespaced = final.output
    assert reasoning.content[0].text == "Need weather."  # type: ignore[union-attr,index]
    assert reasoning.encrypted_content == seal_reasoning(KEY, "Need weather.")  # type: ignore[union-attr]
    assert final.output_text == "Checking. "
    assert (call.name, json.loads(call.arguments)) == (  # type: ignore[union-attr,arg-type]
        "get_weather", {"city": "Paris"})
    assert (namespaced.namespace, namespaced.name) == ("mcp", "ls")  # type: ignore[union-attr]
    assert final.status == "completed" and final.usage is not None
    assert (final.usage.input_tokens, final.usage.output_tokens) == (7, 30)
    assert events[0]["type"] == "response.created" and events[1]["type"] == (
        "response.in_progress")
    done = [e["item"] for e in events if e["type"] == "response.output_item.done"]
    assert [item.get("status") for item in done] == [None, "completed", "completed",
                                                      "completed"]


def test_a_capped_answer_is_incomplete_and_custom_calls_carry_input() -> None:
    """Reaching the cap: response.incomplete, reason max_output_tokens, the message item
    incomplete; a custom tool's call is a custom_tool_call with its input string."""
    got = answer(request())
    raw = b"".join([*got.build.start(), *got.feed("Once upon"), *got.finish(
        Finished("length", 3, 4))])
    events = sse_events(raw)
    assert events[-1]["type"] == "response.incomplete"
    body = events[-1]["response"]
    assert body["incomplete_details"] == {"reason": "max_output_tokens"}
    assert body["output"][0]["status"] == "incomplete"
    custom = answer(request(tools=[PATCH]))
    custom.feed('<tool_call>\n{"name": "apply_patch", "arguments": {"input": "*** Begin"}}\n'
                "</tool_call>")
    custom.finish(Finished("stop", 3, 4))
    item = custom.build.items[0]
    assert msgspec.to_builtins(item) == {
        "type": "custom_tool_call", "id": item.id, "call_id": item.call_id,  # type: ignore[union-attr]
        "name": "apply_patch", "input": "*** Begin", "status": "completed"}


def test_effort_switches_thinking_and_tools_fall_back_under_auto() -> None:
    """reasoning.effort none/minimal turns the template's thinking off, others on; a
    template without tool calling answers without tools under auto, and refuses a forced
    call."""
    assert template_kwargs(request(reasoning={"effort": "none"})) == {"enable_thinking": False}
    assert template_kwargs(request(reasoning={"effort": "high"})) == {"enable_thinking": True}
    assert template_kwargs(request(reasoning={"summary": "auto"})) == {}
    plain = SimpleNamespace(has_tool_calling=False)
    tools = tool_set([WEATHER])
    assert tool_plan(request(tool_choice="auto"), tools, plain).tools is None
    with pytest.raises(ApiError) as caught:
        tool_plan(request(tool_choice="required"), tools, plain)
    assert caught.value.body.param == "tools"


def test_codex_cli_first_request_is_accepted() -> None:
    """Codex CLI 0.169.0's recorded first request decodes, passes every check, renders (its
    developer messages in the system message) and offers its function and namespace tools,
    not web_search."""
    raw = (Path(__file__).parents[2] / "fixtures" / "responses"
           / "codex-0.169.0-first-turn.json").read_bytes()
    req = decode_body(raw, ResponsesRequest)
    check_request(req, req.model)
    messages = template_messages(req, KEY)
    assert [m["role"] for m in messages] == ["system", "user", "user"]
    names = [f["function"]["name"] for f in tool_set(req.tools).functions]
    assert "exec_command" in names and "multi_agent_v1.spawn_agent" in names
    assert len(names) == 12
    assert tool_plan(req, tool_set(req.tools), TOKENIZER).tools is not None


def test_text_format_is_parsed_and_kept() -> None:
    """text.format is read into the JSON the answer must be (for constrained decoding to
    take): json_schema's schema and strict (default on), json_object, plain text."""
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    asked = text_format(request(text={"format": {"type": "json_schema", "name": "x",
                                                 "schema": schema}}))
    assert asked is not None and (asked.schema, asked.strict) == (schema, True)
    lenient = text_format(request(text={"format": {"type": "json_schema", "name": "x",
                                                   "schema": schema, "strict": False}}))
    assert lenient is not None and not lenient.strict
    anything = text_format(request(text={"format": {"type": "json_object"}}))
    assert anything is not None and anything.schema is None
    assert text_format(request(text={"format": {"type": "text"}})) is None
    assert text_format(request()) is None
