"""POST /v1/responses through the gateway with its API key, by the official openai SDK (and one
request as Codex CLI sends it), on a 1-rank cluster of the tiny random Llama (the bundled
model's tokenizer) with a Qwen-style tool template, forced (rank_env.FORCED_OUTPUT) to
answer with text and a call: what the model would say is not the point here, the API is."""

from __future__ import annotations

import json
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from contract.rank_env import FORCED_OUTPUT
from testkit.orchestrator_process import running, write_cluster
from testkit.responses_sdk import accumulate, sse_events
from testkit.tiny_model import write_tiny_model

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]
FIXTURES = Path(__file__).parents[2] / "fixtures" / "tool_calls"
KEY = "responses-key"
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
FORCED = "Checking. " + CALL
WEATHER: Any = {"type": "function", "name": "get_weather", "description": "Weather of a city",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}


@dataclass(frozen=True)
class Served:
    url: str
    model: str

    def client(self, key: str = KEY) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key=key, max_retries=0)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """The tiny model (a step costs ~1/10 of SmolLM2's) with a tool template, one local
    rank, behind a gateway that wants KEY."""
    model = write_tiny_model(tmp_path_factory.mktemp("responses-model") / "tiny-tools")
    config_path = model / "tokenizer_config.json"
    config = json.loads(config_path.read_text(encoding="utf-8"))
    config["chat_template"] = (FIXTURES / "qwen_tools_template.jinja").read_text(encoding="utf-8")
    config_path.write_text(json.dumps(config), encoding="utf-8")
    cluster = write_cluster(
        tmp_path_factory.mktemp("responses"), str(model),
        [{"name": "a", "env": {FORCED_OUTPUT: FORCED}}],
        api={"api_key_env": "RESPONSES_API_KEY"}, supervisor={"standby_ranks": False},
    )
    api = tomllib.loads(cluster.read_text())["api"]
    url = f"http://{api['host']}:{api['port']}"
    with running(cluster, {"RESPONSES_API_KEY": KEY}, url):
        yield Served(url, model.name)


def test_whole_and_both_streaming_calls(served: Served) -> None:
    """Without tools the call text is plain output_text; create(stream=True) yields the
    events in order (created, in_progress ... completed) and responses.stream() builds the
    same final response as the whole answer."""
    client = served.client()
    whole = client.responses.create(model=served.model, input="Hi", store=False)
    assert whole.status == "completed" and whole.output_text == FORCED
    assert whole.usage is not None and whole.usage.output_tokens > 0
    events = list(client.responses.create(model=served.model, input="Hi", stream=True))
    kinds = [e.type for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress",
                         "response.output_item.added", "response.content_part.added"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done",
                          "response.output_item.done", "response.completed"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == FORCED
    with client.responses.stream(model=served.model, input="Hi") as stream:
        final = stream.get_final_response()
    assert final.output_text == FORCED


def test_function_tool_round_trip_with_developer_role(served: Served) -> None:
    """A developer message and instructions; the call comes back as a function_call item
    after the text; sent back with its output, the next turn is answered with the output
    in its prompt (streamed calls: test_codex_cli_request_is_served)."""
    client = served.client()
    asked: list[Any] = [
        {"role": "developer", "content": "Answer with tools."},
        {"role": "user", "content": "Weather in Paris?"},
    ]
    first = client.responses.create(model=served.model, instructions="Be brief.", input=asked,
                                    tools=[WEATHER])
    assert [item.type for item in first.output] == ["message", "function_call"]
    call = first.output[1]
    assert call.type == "function_call" and call.name == "get_weather"
    assert json.loads(call.arguments) == {"city": "Paris"}
    history = [*asked, *[item.model_dump(exclude_none=True) for item in first.output],
               {"type": "function_call_output", "call_id": call.call_id, "output": "21 C"}]
    again = client.responses.create(model=served.model, instructions="Be brief.",
                                    input=history, tools=[WEATHER])
    assert again.status == "completed"
    assert first.usage is not None and again.usage is not None
    assert again.usage.input_tokens > first.usage.input_tokens


def test_codex_cli_request_is_served(served: Served) -> None:
    """A request shaped as Codex CLI sends it (namespace and hosted tools, reasoning,
    include, store false, prompt_cache_key, client_metadata): a stream whose call arrives
    in function_call_arguments events, which the SDK's accumulator takes to the end."""
    body = {
        "model": served.model, "instructions": "You are a coding agent.", "stream": True,
        "input": [{"type": "message", "role": "user",
                   "content": [{"type": "input_text", "text": "Weather?"}]}],
        "tools": [{"type": "namespace", "name": "mcp", "description": "MCP server",
                   "tools": [{**WEATHER, "name": "get_weather"}]},
                  {"type": "web_search"}],
        "tool_choice": "auto", "parallel_tool_calls": False,
        "reasoning": {"effort": "medium", "summary": "auto"}, "store": False,
        "include": ["reasoning.encrypted_content"], "prompt_cache_key": "thread-1",
        "client_metadata": {"originator": "codex_exec"}, "text": {"verbosity": "low"},
    }
    reply = httpx.post(f"{served.url}/v1/responses", json=body, timeout=120,
                       headers={"Authorization": f"Bearer {KEY}"})
    assert reply.status_code == 200, reply.text
    events = sse_events(reply.content)
    assert "response.function_call_arguments.done" in [e["type"] for e in events]
    final = accumulate(events)
    # The forced call names get_weather, not mcp.get_weather: not a tool of this request,
    # so it is answered as written, without a namespace.
    assert final.status == "completed" and final.output[-1].type == "function_call"


def test_caps_and_errors(served: Served) -> None:
    """max_output_tokens above the limit is capped, not refused; reaching it is
    status incomplete with the reason; errors are OpenAI's, naming the field; the key is
    required."""
    client = served.client()
    big = client.responses.create(model=served.model, input="Hi", max_output_tokens=10**6)
    assert big.status == "completed"
    short = client.responses.create(model=served.model, input="Hi", max_output_tokens=3)
    assert short.status == "incomplete" and short.incomplete_details is not None
    assert short.incomplete_details.reason == "max_output_tokens"
    assert short.usage is not None and short.usage.output_tokens == 3
    with pytest.raises(openai.BadRequestError) as stateful:
        client.responses.create(model=served.model, input="Hi", previous_response_id=big.id)
    assert stateful.value.body["param"] == "previous_response_id"  # type: ignore[index]
    # A JSON format's answer: tests/serving/api/test_structured_outputs.py (rank 0 here
    # answers a forced text, which no grammar allows); its schema is still compiled here.
    with pytest.raises(openai.BadRequestError) as structured:
        client.responses.create(model=served.model, input="Hi", text={"format": {
            "type": "json_schema", "name": "x", "schema": {
                "type": "object", "properties": {"a": {"type": "string", "format": "nope"}}}}})
    assert structured.value.body["param"] == "text.format.schema"  # type: ignore[index]
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model="nope", input="Hi")
    with pytest.raises(openai.AuthenticationError):
        served.client("wrong").responses.create(model=served.model, input="Hi")
