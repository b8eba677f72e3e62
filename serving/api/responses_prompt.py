"""Responses requests, checked and translated for the engine: `instructions` and `input`
items as the chat template's messages, the output cap, sampling parameters. Every problem
is a 400 naming its field as OpenAI does (`input.2.call_id`)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from contract.responses_schemas import ResponsesRequest
from serving.api.chat_reasoning import EFFORTS as THINKING
from serving.api.errors import check_served, invalid
from serving.api.generation import random_seed
from serving.api.responses_tools import template_name
from serving.api.state import ServedModel
from serving.api.structured import json_grammar
from serving.api.thinking_signature import BadSignature, sign, verify
from serving.engine.step_plan import SamplingParams

ENCRYPTED_REASONING = "reasoning.encrypted_content"
# include values naming items this server never makes: accepted, nothing to add.
INCLUDE_NO_EFFECT = frozenset({
    "file_search_call.results", "web_search_call.results", "web_search_call.action.sources",
    "message.input_image.image_url", "computer_call_output.output.image_url",
    "code_interpreter_call.outputs",
})
TEXT_PARTS = ("input_text", "output_text", "text", "summary_text", "reasoning_text")
SYSTEM_ROLES = ("system", "developer")


def check_request(req: ResponsesRequest, served: str | frozenset[str]) -> None:
    """Each field's value; what is stateful or not served is a 400 that says why."""
    check_served(req.model, served)
    if req.previous_response_id is not None:
        raise invalid(
            "this server keeps no responses (store is always false): send the whole "
            "conversation in input instead of previous_response_id",
            "previous_response_id", "unsupported_parameter",
        )
    if req.background:
        raise invalid("background responses need a response store, which this server "
                      "does not keep", "background", "unsupported_parameter")
    if req.max_output_tokens is not None and req.max_output_tokens < 1:
        raise invalid(f"max_output_tokens must be at least 1, got {req.max_output_tokens}",
                      "max_output_tokens")
    if req.temperature is not None and not 0 <= req.temperature <= 2:
        raise invalid(f"temperature must be in [0, 2], got {req.temperature}", "temperature")
    if req.top_p is not None and not 0 < req.top_p <= 1:
        raise invalid(f"top_p must be in (0, 1], got {req.top_p}", "top_p")
    if req.top_logprobs:
        raise invalid("top_logprobs is not supported on /v1/responses; leave it out",
                      "top_logprobs", "unsupported_parameter")
    if req.truncation not in (None, "auto", "disabled"):
        raise invalid("truncation must be auto or disabled", "truncation")
    if req.reasoning is not None and req.reasoning.effort not in (None, *THINKING):
        raise invalid(f"reasoning.effort must be one of {', '.join(THINKING)}",
                      "reasoning.effort")
    for i, value in enumerate(req.include or []):
        if value != ENCRYPTED_REASONING and value not in INCLUDE_NO_EFFECT:
            raise invalid(f"include value {value!r} is not supported here", f"include.{i}",
                          "unsupported_parameter")
    text_format_grammar(req)  # a schema that does not compile: the 400 now


@dataclass(frozen=True)
class JsonFormat:
    """`text.format` asking for JSON: `schema` None is json_object (any JSON object)."""

    schema: dict[str, Any] | None
    strict: bool


def text_format(req: ResponsesRequest) -> JsonFormat | None:
    """`text.format` checked: None for plain text, else the JSON the answer must be."""
    form = req.text.format if req.text is not None else None
    kind = form.get("type") if form is not None else "text"
    if form is None or kind == "text":
        return None
    if kind == "json_object":
        return JsonFormat(None, strict=True)
    if kind != "json_schema":
        raise invalid("text.format.type must be text, json_schema or json_object",
                      "text.format.type")
    if not isinstance(form.get("schema"), dict):
        raise invalid("text.format of type json_schema needs its schema (an object)",
                      "text.format.schema")
    return JsonFormat(form["schema"], strict=form.get("strict") is not False)


def text_format_grammar(req: ResponsesRequest) -> str:
    """`text.format`: "" for text, else the grammar of its json_object or json_schema
    (strict unless the format says `strict: false`)."""
    wanted = text_format(req)
    if wanted is None:
        return ""
    param = "text.format" if wanted.schema is None else "text.format.schema"
    return json_grammar(wanted.schema, strict=wanted.strict, param=param)


def wants_encrypted_reasoning(req: ResponsesRequest) -> bool:
    return ENCRYPTED_REASONING in (req.include or [])


def template_kwargs(req: ResponsesRequest) -> dict[str, Any]:
    """reasoning.effort as the template's thinking switch (chat's reasoning_effort's
    rule: none and minimal turn it off); templates without the switch ignore it."""
    effort = req.reasoning.effort if req.reasoning is not None else None
    return {} if effort is None else {"enable_thinking": THINKING[effort]}


def max_tokens(req: ResponsesRequest, prompt_tokens: int, model: ServedModel, limit: int) -> int:
    """max_output_tokens is a ceiling, as agents size it: capped at the server's limit and at
    what the context leaves; absent, as much as both allow. The answer says
    `incomplete_details.reason: "max_output_tokens"` when it reaches the cap."""
    asked = limit if req.max_output_tokens is None else req.max_output_tokens
    return max(1, min(asked, limit, model.context_length - prompt_tokens))


def sampling_params(req: ResponsesRequest, model: ServedModel, cap: int) -> SamplingParams:
    return SamplingParams(
        temperature=1.0 if req.temperature is None else req.temperature,
        top_p=1.0 if req.top_p is None else req.top_p,
        top_k=0,
        max_tokens=cap,
        seed=random_seed(),
        forced=model.forced_output,
        grammar=text_format_grammar(req),
    )


def template_messages(req: ResponsesRequest, key: bytes) -> list[dict[str, Any]]:
    """`instructions`, then each input item, as the chat template's messages. The leading
    system and developer messages join `instructions` in one system message (templates
    want one, first); calls join the assistant turn before them. `key`: the cluster's
    thinking key, which checks the reasoning items' encrypted_content."""
    items: list[dict[str, Any]]
    items = [{"role": "user", "content": req.input}] if isinstance(req.input, str) else req.input
    if not items:
        raise invalid("input must not be empty", "input")
    out: list[dict[str, Any]] = []
    system = [req.instructions] if req.instructions else []
    reasoning = ""
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise invalid("an input item is an object", f"input.{i}")
        kind = item.get("type", "message")
        if kind == "message" and item.get("role") in SYSTEM_ROLES and not out:
            system.append(_content(f"input.{i}", item.get("content")))
        elif kind == "reasoning":
            reasoning += _reasoning_text(f"input.{i}", item, key)
        else:
            _add(out, f"input.{i}", kind, item, reasoning)
            reasoning = ""
    head = [{"role": "system", "content": "\n\n".join(system)}] if system else []
    return head + out


def _add(out: list[dict[str, Any]], where: str, kind: str, item: dict[str, Any],
         reasoning: str) -> None:
    if kind == "message":
        role = item.get("role")
        if role not in ("user", "assistant", *SYSTEM_ROLES):
            raise invalid(f"role must be user, assistant, system or developer, got {role!r}",
                          f"{where}.role")
        turn = {"role": "system" if role in SYSTEM_ROLES else role,
                "content": _content(where, item.get("content"))}
        if role == "assistant" and reasoning:
            turn["reasoning_content"] = reasoning
        out.append(turn)
    elif kind in ("function_call", "custom_tool_call"):
        _assistant(out, reasoning).setdefault("tool_calls", []).append(_call(where, item))
    elif kind in ("function_call_output", "custom_tool_call_output"):
        call_id = _string(where, item, "call_id")
        out.append({"role": "tool", "tool_call_id": call_id,
                    "content": _content(f"{where}.output", item.get("output"))})
    elif kind == "item_reference":
        raise invalid("item_reference needs a response store, which this server does not "
                      "keep; send the item itself", f"{where}.type", "unsupported_parameter")
    else:
        raise invalid(f"input items of type {kind!r} are not supported here", f"{where}.type",
                      "unsupported_parameter")


def _assistant(out: list[dict[str, Any]], reasoning: str) -> dict[str, Any]:
    """The assistant turn a call belongs to: the last message if it is one, else a new one."""
    if not out or out[-1]["role"] != "assistant":
        out.append({"role": "assistant", "content": ""})
        if reasoning:
            out[-1]["reasoning_content"] = reasoning
    return out[-1]


def _call(where: str, item: dict[str, Any]) -> dict[str, Any]:
    name = template_name(_string(where, item, "name"), item.get("namespace"))
    if item["type"] == "custom_tool_call":
        arguments: Any = {"input": _string(where, item, "input")}
    else:
        try:
            arguments = json.loads(_string(where, item, "arguments"))
        except ValueError as exc:
            raise invalid(f"arguments must be JSON text: {exc}", f"{where}.arguments") from exc
    function = {"name": name, "arguments": arguments}
    return {"id": _string(where, item, "call_id"), "type": "function", "function": function}


def _string(where: str, item: dict[str, Any], key: str) -> str:
    value = item.get(key)
    if not isinstance(value, str):
        raise invalid(f"{key} must be a string", f"{where}.{key}")
    return value


def _content(where: str, content: Any) -> str:
    """A message's (or a tool output's) text: a string, or its text parts joined."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise invalid("content must be a string or a list of parts", f"{where}.content")
    text = ""
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "refusal":
            text += str(part.get("refusal", ""))
        elif kind in TEXT_PARTS and isinstance(part.get("text"), str):
            text += part["text"]
        else:
            raise invalid(f"only text parts are supported here, not {kind!r}",
                          f"{where}.content.{j}.type", "unsupported_parameter")
    return text


def _reasoning_text(where: str, item: dict[str, Any], key: bytes) -> str:
    """An earlier turn's reasoning: its content's text, else what its encrypted_content
    carries (one of ours: see seal_reasoning), else its summary."""
    if item.get("content"):
        return _content(where, item["content"])
    sealed = item.get("encrypted_content")
    if sealed is not None:
        return open_reasoning(f"{where}.encrypted_content", sealed, key)
    return _content(f"{where}.summary", item.get("summary") or [])


def seal_reasoning(key: bytes, text: str) -> str:
    """The opaque `encrypted_content` of a reasoning item: its text signed with the
    cluster's key and carried along (as thinking blocks' signatures are: not secret, the
    client has the text), so a client that keeps only this can send the reasoning back."""
    return sign(key, text, carry_text=True)


def open_reasoning(where: str, sealed: Any, key: bytes) -> str:
    try:
        return verify(key, str(sealed), "")
    except BadSignature as exc:
        raise invalid(f"encrypted_content: {exc}", where) from exc
