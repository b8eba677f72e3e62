"""Tool calling: mlx-lm's parsers on recorded model outputs, and a tiny model at 2 ranks
behind the gateway through the openai client, forced (rank_env.FORCED_OUTPUT) to emit a
call in its template's format."""

from __future__ import annotations

import json
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import anthropic
import msgspec
import openai
import pytest
from mlx_lm.tool_parsers import json_tools, qwen3_coder
from mlx_lm.utils import load_tokenizer

from contract.openai_errors import ApiError
from contract.openai_schemas import ChatCompletionRequest
from contract.rank_env import FORCED_OUTPUT
from serving.api.tool_calls import ToolCallStream, ToolPlan, plan_tools
from testkit import paths
from testkit.orchestrator_process import running, write_cluster
from testkit.tiny_model import write_tiny_model

FIXTURES = paths.FIXTURES / "tool_calls"
OUTPUTS: dict[str, str] = json.loads((FIXTURES / "outputs.json").read_text(encoding="utf-8"))
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather of a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
MULTIPLY = {
    "type": "function",
    "function": {
        "name": "multiply",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
        },
    },
}
FORCED = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


def parser_of(module: ModuleType) -> Any:
    """What a TokenizerWrapper exposes of the parser mlx-lm picked for a model."""
    return SimpleNamespace(
        has_tool_calling=True,
        tool_call_start=module.tool_call_start,
        tool_call_end=module.tool_call_end,
        tool_parser=module.parse_tool_call,
    )


def split(text: str, module: ModuleType, chunk: int = 0, parallel: bool = True) -> tuple[str, Any]:
    stream = ToolCallStream(parser_of(module), ToolPlan([WEATHER, MULTIPLY], parallel=parallel))
    pieces = [text[i : i + chunk] for i in range(0, len(text), chunk)] if chunk else [text]
    content = ""
    for piece in pieces:
        content += stream.feed(piece)[0]
    content += stream.finish()[0]
    return content, [(c.function.name, json.loads(c.function.arguments)) for c in stream.calls]


@pytest.mark.parametrize("chunk", [0, 1, 7])
def test_json_calls_are_parsed_out_of_the_text(chunk: int) -> None:
    """Qwen's JSON calls, whole or streamed in pieces: the text around them is content."""
    content, calls = split(OUTPUTS["qwen3_json_single"], json_tools, chunk)
    assert content == "I'll multiply them.\n"
    assert calls == [("multiply", {"a": 12234585, "b": 48838483920})]
    _, calls = split(OUTPUTS["qwen3_json_parallel"], json_tools, chunk)
    assert calls == [("get_weather", {"city": "Paris"}), ("get_weather", {"city": "Lyon"})]


def test_parallel_calls_off_keeps_the_first_and_other_parsers_work() -> None:
    """parallel_tool_calls=false keeps one call; Qwen3-Coder's XML parser is used as is."""
    _, calls = split(OUTPUTS["qwen3_json_parallel"], json_tools, parallel=False)
    assert calls == [("get_weather", {"city": "Paris"})]
    _, calls = split(OUTPUTS["qwen3_coder_xml"], qwen3_coder, 5)
    assert calls == [("multiply", {"a": 12234585, "b": 48838483920})]


def test_a_call_cut_short_comes_back_as_text() -> None:
    """A call the parser cannot read (max_tokens cut it) is returned as content, not lost."""
    content, calls = split(OUTPUTS["qwen3_json_truncated"], json_tools, 3)
    assert calls == [] and content == OUTPUTS["qwen3_json_truncated"]


def request(**fields: Any) -> ChatCompletionRequest:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], **fields}
    return msgspec.convert(body, ChatCompletionRequest)


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"tool_choice": "auto"}, "tool_choice"),
        ({"tools": [WEATHER], "tool_choice": "sometimes"}, "tool_choice"),
        ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "x"}}},
         "tool_choice.function.name"),
        ({"tools": [{"type": "retrieval", "function": {"name": "x"}}]}, "tools[0].type"),
    ],
)
def test_tool_fields_that_cannot_work_are_400(fields: dict[str, Any], param: str) -> None:
    with pytest.raises(ApiError) as caught:
        plan_tools(request(**fields), parser_of(json_tools))
    assert caught.value.status == 400 and caught.value.body.param == param


def test_tool_choice_plans() -> None:
    """none renders no tools; required and a named function open the call in the prompt."""
    tok = parser_of(json_tools)
    assert plan_tools(request(tools=[WEATHER], tool_choice="none"), tok).tools is None
    assert plan_tools(request(tools=[WEATHER]), tok).open_call is False
    assert plan_tools(request(tools=[WEATHER], tool_choice="required"), tok).open_call
    named = plan_tools(
        request(tools=[WEATHER, MULTIPLY],
                tool_choice={"type": "function", "function": {"name": "multiply"}}), tok)
    assert named.open_call and [t["function"]["name"] for t in named.tools or []] == ["multiply"]
    no_tools = SimpleNamespace(has_tool_calling=False)
    assert plan_tools(request(tools=[WEATHER]), no_tools).tools is None  # auto: answers in text
    with pytest.raises(ApiError) as caught:
        plan_tools(request(tools=[WEATHER], tool_choice="required"), no_tools)
    assert caught.value.body.param == "tools"


@dataclass(frozen=True)
class ToolServer:
    base_url: str  # the gateway's
    model: Path


@pytest.fixture(scope="module")
def tool_server(
    tmp_path_factory: pytest.TempPathFactory, bundled_quantized_dir: Path
) -> Iterator[ToolServer]:
    """The tiny model (its tokenizer from the bundled one) with a Qwen-style tool template,
    at 2 local tensor ranks behind the gateway (3 on 2 cores busy-poll each other), forced
    to answer with FORCED."""
    model = write_tiny_model(tmp_path_factory.mktemp("tool-model") / "m")
    config_path = model / "tokenizer_config.json"
    config = json.loads(config_path.read_text(encoding="utf-8"))
    config["chat_template"] = (FIXTURES / "qwen_tools_template.jinja").read_text(encoding="utf-8")
    config_path.write_text(json.dumps(config), encoding="utf-8")
    nodes = [{"name": f"r{i}", "ip": "127.0.0.1", "env": {FORCED_OUTPUT: FORCED}}
             for i in range(2)]
    cluster = write_cluster(tmp_path_factory.mktemp("tools"), str(model), nodes,
                            supervisor={"standby_ranks": False})
    api = tomllib.loads(cluster.read_text())["api"]
    url = f"http://{api['host']}:{api['port']}"
    with running(cluster, url=url):
        yield ToolServer(url, model)


@pytest.mark.e2e
def test_openai_client_gets_tool_calls(tool_server: ToolServer) -> None:
    """Non-streaming: message.tool_calls and finish_reason tool_calls; the call and its
    result go back in the history and the next turn is answered, with the whole result in
    its prompt (a longer result: more prompt tokens, exactly as many as it has more)."""
    client = openai.OpenAI(base_url=f"{tool_server.base_url}/v1", api_key="x", max_retries=0)
    messages: list[Any] = [{"role": "user", "content": "Weather in Paris?"}]
    first = client.chat.completions.create(
        model="m", messages=messages, tools=[WEATHER], max_tokens=64  # type: ignore[list-item]
    )
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    call = (choice.message.tool_calls or [])[0]
    assert call.type == "function" and call.function.name == "get_weather"  # type: ignore[union-attr]
    assert json.loads(call.function.arguments) == {"city": "Paris"}  # type: ignore[union-attr]
    prompt_tokens = {}
    for result in ('{"temp_c": 21}', '{"temp_c": 21, "sky": "clear", "wind_kmh": 12}'):
        turn = [*messages, choice.message.model_dump(exclude_none=True),
                {"role": "tool", "tool_call_id": call.id, "content": result}]
        again = client.chat.completions.create(
            model="m", messages=turn, tools=[WEATHER], max_tokens=64  # type: ignore[list-item]
        )
        assert again.choices[0].finish_reason == "tool_calls"
        assert again.usage is not None
        prompt_tokens[result] = again.usage.prompt_tokens
    tokenizer = load_tokenizer(tool_server.model)
    short, long = prompt_tokens
    grew = len(tokenizer.encode(long, add_special_tokens=False)) - len(
        tokenizer.encode(short, add_special_tokens=False))
    assert prompt_tokens[long] - prompt_tokens[short] == grew > 0, (prompt_tokens, grew)


@pytest.mark.e2e
def test_streamed_tool_calls_arrive_as_deltas(tool_server: ToolServer) -> None:
    """Streaming: the call arrives in delta.tool_calls (index, id, name, arguments)."""
    client = openai.OpenAI(base_url=f"{tool_server.base_url}/v1", api_key="x", max_retries=0)
    stream = client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "Weather?"}],
        tools=[WEATHER], max_tokens=64, stream=True,  # type: ignore[list-item]
    )
    chunks = list(stream)
    deltas = [d for c in chunks for d in (c.choices[0].delta.tool_calls or []) if c.choices]
    assert [(d.index, d.function.name) for d in deltas] == [(0, "get_weather")]  # type: ignore[union-attr]
    assert json.loads(deltas[0].function.arguments or "") == {"city": "Paris"}  # type: ignore[union-attr]
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert "<tool_call>" not in content


CLAUDE_TOOLS: list[Any] = [{
    "name": "get_weather",
    "description": "Current weather of a city",
    "input_schema": WEATHER["function"]["parameters"],  # type: ignore[index]
}]


@pytest.mark.e2e
def test_anthropic_client_gets_tool_use_and_sends_results(tool_server: ToolServer) -> None:
    """Anthropic's tools: the call is a tool_use block (input an object), stop_reason
    tool_use; the tool_use and its tool_result go back in the history, the result reaches
    the prompt (count_tokens grows with it) and the next turn is answered."""
    claude = anthropic.Anthropic(base_url=tool_server.base_url, api_key="x", max_retries=0)
    asked: list[Any] = [{"role": "user", "content": "Weather in Paris?"}]
    first = claude.messages.create(model="m", max_tokens=64, tools=CLAUDE_TOOLS, messages=asked)
    assert first.stop_reason == "tool_use"
    use = next(b for b in first.content if isinstance(b, anthropic.types.ToolUseBlock))
    assert use.name == "get_weather" and use.input == {"city": "Paris"}

    def history(result: str) -> list[Any]:
        return [*asked,
                {"role": "assistant", "content": [b.model_dump(exclude_none=True)
                                                  for b in first.content]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": use.id, "content": result}]}]

    def count(messages: list[Any]) -> int:
        return claude.messages.count_tokens(
            model="m", tools=CLAUDE_TOOLS, messages=messages).input_tokens

    short, long = count(history("21 C")), count(history("21 C, sunny, light wind from the west"))
    assert count(asked) < short < long
    again = claude.messages.create(
        model="m", max_tokens=64, tools=CLAUDE_TOOLS, messages=history("21 C"))
    assert again.usage.input_tokens == short and again.stop_reason == "tool_use"


@pytest.mark.e2e
def test_anthropic_streamed_tool_use(tool_server: ToolServer) -> None:
    """Streaming: the call arrives as a tool_use block whose input the client assembles from
    input_json_delta; no call markup leaks into text."""
    claude = anthropic.Anthropic(base_url=tool_server.base_url, api_key="x", max_retries=0)
    with claude.messages.stream(
        model="m", max_tokens=64, tools=CLAUDE_TOOLS,
        tool_choice={"type": "auto", "disable_parallel_tool_use": True},
        messages=[{"role": "user", "content": "Weather?"}],
    ) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_message()
    assert "input_json" in kinds and final.stop_reason == "tool_use"
    blocks = [(b.type, getattr(b, "input", None)) for b in final.content]
    assert ("tool_use", {"city": "Paris"}) in blocks
    assert all("<tool_call>" not in getattr(b, "text", "") for b in final.content)
