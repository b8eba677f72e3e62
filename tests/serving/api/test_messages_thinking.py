"""The Messages API's reasoning fields without a model: thinking plans, clear_thinking
edits, signatures, deferred tools, the cluster's key and the Anthropic error types."""

from __future__ import annotations

import stat
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import msgspec
import pytest
from mlx_lm.tool_parsers import json_tools

from contract.anthropic_schemas import MessagesRequest, error_payload
from contract.openai_errors import ApiError
from orchestrator.launch import thinking_key
from serving.api.messages_prompt import tool_plan
from serving.api.messages_thinking import ThinkingPlan, thinking_plan, turn_reasoning
from serving.api.thinking_signature import BadSignature, load_key, sign, verify

KEY = b"k" * 32


def request(**fields: Any) -> MessagesRequest:
    body = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}],
            **fields}
    return msgspec.convert(body, MessagesRequest)


def test_thinking_plans() -> None:
    """disabled turns the switch off, adaptive on with effort's ceiling, budget_tokens
    sets it, no thinking leaves the template's default; clear_thinking's keep is read."""
    assert thinking_plan(request()) == ThinkingPlan(None, None, False, None)
    assert thinking_plan(request(thinking={"type": "disabled"})).enabled is False
    adaptive = thinking_plan(request(thinking={"type": "adaptive", "display": "omitted"},
                                     output_config={"effort": "low"}))
    assert adaptive == ThinkingPlan(True, 1024, True, None)
    assert thinking_plan(request(thinking={"type": "enabled", "budget_tokens": 2000})).budget \
        == 2000
    edits = {"edits": [{"type": "clear_thinking_20251015",
                        "keep": {"type": "thinking_turns", "value": 2}}]}
    assert thinking_plan(request(context_management=edits)).keep_turns == 2
    one = {"edits": [{"type": "clear_thinking_20251015"}]}
    assert thinking_plan(request(context_management=one)).keep_turns == 1


def test_signatures_check_the_text_and_the_key() -> None:
    """A signature vouches for its text under its key only; an omitted display's carries
    the text back."""
    assert verify(KEY, sign(KEY, "why"), "why") == "why"
    assert verify(KEY, sign(KEY, "why", carry_text=True), "") == "why"
    for signature, shown in ((sign(KEY, "why"), "what"), (sign(b"o" * 32, "why"), "why"),
                             ("v1.!!", "why"), ("", "why")):
        with pytest.raises(BadSignature):
            verify(KEY, signature, shown)


def test_only_the_kept_turns_thinking_reaches_the_prompt() -> None:
    """keep N: the last N assistant turns' thinking; every block is checked all the same."""
    def turn(text: str) -> dict[str, Any]:
        return {"role": "assistant", "content": [
            {"type": "thinking", "thinking": text, "signature": sign(KEY, text)},
            {"type": "text", "text": "a"}]}
    user = {"role": "user", "content": "q"}
    req = request(messages=[user, turn("one"), user, turn("two"), user])
    assert turn_reasoning(KEY, req.messages, None) == {1: "one", 3: "two"}
    assert turn_reasoning(KEY, req.messages, 1) == {3: "two"}
    assert turn_reasoning(KEY, req.messages, 0) == {}
    with pytest.raises(ApiError) as caught:
        turn_reasoning(b"x" * 32, req.messages, 0)
    assert caught.value.body.param == "messages.1.content.0.signature"


def test_deferred_tools_stay_out_until_referenced() -> None:
    """defer_loading keeps a tool out of the template's tools until a tool_reference in a
    tool_result names it."""
    tokenizer = SimpleNamespace(has_tool_calling=True, tool_call_start=json_tools.tool_call_start,
                                tool_call_end=json_tools.tool_call_end,
                                tool_parser=json_tools.parse_tool_call)
    tools = [{"name": "a", "input_schema": {}},
             {"name": "b", "input_schema": {}, "defer_loading": True}]
    names = [t["function"]["name"] for t in tool_plan(request(tools=tools), tokenizer).tools or []]
    assert names == ["a"]
    found = [{"role": "user", "content": "hi"},
             {"role": "assistant", "content": [
                 {"type": "tool_use", "id": "t1", "name": "a", "input": {}}]},
             {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1",
                                           "content": [{"type": "tool_reference",
                                                        "tool_name": "b"}]}]}]
    loaded = tool_plan(request(tools=tools, messages=found), tokenizer).tools or []
    assert [t["function"]["name"] for t in loaded] == ["a", "b"]


def test_the_cluster_key_is_kept_once_owner_only(tmp_path: Path) -> None:
    """The head draws the key once (0600) and gives the same one to every launch; rank 0
    reads it from its directory, or draws its own without one."""
    first = thinking_key.ensure(tmp_path, "c")
    assert thinking_key.ensure(tmp_path, "c") == first
    path = thinking_key.key_path(tmp_path, "c")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    (tmp_path / "thinking_key").write_text(first)
    assert load_key(tmp_path) == load_key(tmp_path) == first.encode()
    assert load_key(tmp_path / "none") != load_key(tmp_path / "none")


@pytest.mark.parametrize(("status", "kind"), [(413, "request_too_large"),
                                              (504, "timeout_error"), (400,
                                                                       "invalid_request_error")])
def test_anthropic_error_types(status: int, kind: str) -> None:
    """Errors on /v1/messages carry Anthropic's type for the status."""
    body = msgspec.to_builtins(error_payload(ApiError(status, "m"), "/v1/messages"))
    assert body["type"] == "error" and body["error"]["type"] == kind
