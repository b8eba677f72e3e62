"""Anthropic Messages requests, checked and translated for the engine: the chat template's
messages, the tool plan (the same parsers as the OpenAI side), sampling parameters.
Every problem is a 400 naming its field, as Anthropic's own messages do (`messages.0...`)."""

from __future__ import annotations

from typing import Any

from contract.anthropic_schemas import (
    PROMPT_ROLES,
    InputMessage,
    MessagesRequest,
    PromptFields,
    TextBlock,
    ToolReferenceBlock,
    ToolResultBlock,
    ToolUseBlock,
)
from serving.api.errors import check_served, invalid
from serving.api.generation import random_seed
from serving.api.messages_thinking import ThinkingPlan, thinking_plan
from serving.api.reasoning import prompt_opens_reasoning, reasoning_fields
from serving.api.state import ServedModel
from serving.api.structured import json_grammar
from serving.api.tool_calls import ToolPlan, make_plan
from serving.engine.step_plan import SamplingParams

TOOL_CHOICES = {"auto": "auto", "any": "required", "tool": "required", "none": "none"}
SERVICE_TIERS = (None, "auto", "standard_only")  # no effect here: one tier
SPEEDS = (None, "standard", "fast")  # no effect here: one speed
MAX_STOP_SEQUENCES = 16


def check_prompt_fields(req: PromptFields, served: str | frozenset[str]) -> ThinkingPlan:
    """What /v1/messages and its count_tokens share: model, thinking, tools, tool_choice."""
    check_served(req.model, served)
    if not req.messages:
        raise invalid("messages must not be empty", "messages")
    for i, tool in enumerate(req.tools or []):
        if tool.type not in (None, "custom"):
            raise invalid(
                f"only custom tools (name, input_schema) are supported, not {tool.type!r}",
                f"tools.{i}.type", "unsupported_parameter",
            )
    choice = req.tool_choice
    if choice is not None:
        if choice.type not in TOOL_CHOICES:
            raise invalid(f"tool_choice.type must be one of {', '.join(TOOL_CHOICES)}",
                          "tool_choice.type")
        if (choice.type == "tool") != (choice.name is not None):
            raise invalid("tool_choice.name is given with type 'tool', and only then",
                          "tool_choice.name")
    return thinking_plan(req)


def check_request(req: MessagesRequest, served: str | frozenset[str]) -> ThinkingPlan:
    plan = check_prompt_fields(req, served)
    if req.max_tokens < 1:
        raise invalid(f"max_tokens must be at least 1, got {req.max_tokens}", "max_tokens")
    if req.temperature is not None and not 0 <= req.temperature <= 1:
        raise invalid(f"temperature must be in [0, 1], got {req.temperature}", "temperature")
    if req.top_p is not None and not 0 < req.top_p <= 1:
        raise invalid(f"top_p must be in (0, 1], got {req.top_p}", "top_p")
    if req.top_k is not None and req.top_k < 0:
        raise invalid(f"top_k must be >= 0, got {req.top_k}", "top_k")
    stops = req.stop_sequences or []
    if len(stops) > MAX_STOP_SEQUENCES or any(not s for s in stops):
        raise invalid(f"stop_sequences must be up to {MAX_STOP_SEQUENCES} non-empty strings",
                      "stop_sequences")
    if req.service_tier not in SERVICE_TIERS:
        raise invalid(f"service_tier must be auto or standard_only, got {req.service_tier!r}",
                      "service_tier")
    if req.speed not in SPEEDS:
        raise invalid(f"speed must be standard or fast, got {req.speed!r}", "speed")
    return plan


def max_tokens(req: MessagesRequest, prompt_tokens: int, model: ServedModel, limit: int) -> int:
    """max_tokens is a ceiling here, as agents use it (Claude Code asks 32,000): capped at
    the server's limit and at what the context leaves after the prompt; the answer then
    says `stop_reason: "max_tokens"` if it reaches the cap."""
    return max(1, min(req.max_tokens, limit, model.context_length - prompt_tokens))


def sampling_params(req: MessagesRequest, model: ServedModel, max_tokens: int,
                    budget: int | None = None, prompt: list[int] | None = None,
                    ) -> SamplingParams:
    """`budget`: the reasoning's ceiling, applied where the model has think markers."""
    tokenizer = model.tokenizer
    ceiling: dict[str, Any] = {}
    if budget is not None and getattr(tokenizer, "has_thinking", False):
        ceiling = {
            "reasoning_budget": min(budget, max_tokens),
            "think_start": list(tokenizer.think_start_tokens),
            "think_end": list(tokenizer.think_end_tokens),
            "in_reasoning": prompt_opens_reasoning(tokenizer, prompt or []),
        }
    return SamplingParams(
        temperature=1.0 if req.temperature is None else req.temperature,
        top_p=1.0 if req.top_p is None else req.top_p,
        top_k=req.top_k or 0,
        max_tokens=max_tokens,
        seed=random_seed(),
        forced=model.forced_output,
        grammar=output_format_grammar(req),
        **ceiling,
    )


def output_format_grammar(req: MessagesRequest) -> str:
    """`output_config.format`: the answer constrained to JSON valid against its schema
    (strict, as Anthropic's structured outputs are); "" without one."""
    form = req.output_config.format if req.output_config else None
    if form is None:
        return ""
    if form.type != "json_schema":
        raise invalid("output_config.format.type must be json_schema",
                      "output_config.format.type")
    return json_grammar(form.schema, strict=True, param="output_config.format.schema")


def tool_plan(req: PromptFields, tokenizer: Any) -> ToolPlan:
    """Deferred tools (`defer_loading`) stay out of the prompt, as Anthropic keeps them
    out of the model's context, until a tool_result's tool_reference block (the client's
    own tool search) names them; a call to any tool is still parsed."""
    loaded = _referenced(req.messages)
    tools = [
        {"type": "function", "function": {
            "name": t.name, "parameters": t.input_schema,
            **({"description": t.description} if t.description is not None else {}),
        }}
        for t in req.tools or [] if not t.defer_loading or t.name in loaded
    ]
    choice = req.tool_choice
    return make_plan(
        tools,
        TOOL_CHOICES[choice.type] if choice else None,
        choice.name if choice else None,
        not (choice and choice.disable_parallel_tool_use),
        tokenizer,
        "tool_choice.name",
    )


def _referenced(messages: list[InputMessage]) -> set[str]:
    return {
        part.tool_name
        for m in messages if not isinstance(m.content, str)
        for b in m.content if isinstance(b, ToolResultBlock) and isinstance(b.content, list)
        for part in b.content if isinstance(part, ToolReferenceBlock)
    }


def template_messages(req: PromptFields, reasoning: dict[int, str]) -> list[dict[str, Any]]:
    """The chat template's messages: the system prompt, then each turn; a user turn's
    tool_result blocks become `tool` messages, an assistant's tool_use blocks its calls,
    its kept thinking (`reasoning`, by message index) its `reasoning_content`."""
    out: list[dict[str, Any]] = []
    if req.system:
        out.append({"role": "system", "content": _text(req.system)})
    for i, message in enumerate(req.messages):
        turns = _turn(i, message)
        if i in reasoning and turns and turns[-1]["role"] == "assistant":
            turns[-1].update(reasoning_fields(reasoning[i]))
        out += turns
    return out


def _turn(i: int, message: InputMessage) -> list[dict[str, Any]]:
    if message.role not in PROMPT_ROLES:
        raise invalid(f"role must be one of {', '.join(PROMPT_ROLES)}, got {message.role!r}",
                      f"messages.{i}.role")
    if isinstance(message.content, str):
        return [{"role": message.role, "content": message.content}]
    out: list[dict[str, Any]] = []
    text, calls = "", []
    for j, block in enumerate(message.content):
        where = f"messages.{i}.content.{j}"
        if isinstance(block, TextBlock):
            text += block.text
        elif isinstance(block, ToolUseBlock):
            if message.role != "assistant":
                raise invalid("tool_use blocks belong to assistant turns", f"{where}.type")
            function = {"name": block.name, "arguments": block.input}
            calls.append({"id": block.id, "type": "function", "function": function})
        elif isinstance(block, ToolResultBlock):
            if message.role != "user":
                raise invalid("tool_result blocks belong to user turns", f"{where}.type")
            content = _text(block.content or "")
            out.append({"role": "tool", "tool_call_id": block.tool_use_id,
                        "content": f"Error: {content}" if block.is_error else content})
    if text or calls or not out:
        turn: dict[str, Any] = {"role": message.role, "content": text}
        if calls:
            turn["tool_calls"] = calls
        out.append(turn)
    return out


def _text(content: str | list[TextBlock] | list[TextBlock | ToolReferenceBlock]) -> str:
    if isinstance(content, str):
        return content
    return "".join(b.text if isinstance(b, TextBlock) else f"Tool {b.tool_name} loaded."
                   for b in content)
