"""Tool calling: which tools the chat template sees, and the calls parsed out of the text.

Rendering goes through the tokenizer's chat template (`tools=`), parsing through the
tool parser mlx-lm picked for the model (`tokenizer.tool_parser`), and the split between
content and call text through mlx-lm's TextStateMachine on the model's call markers.
`tool_choice: "required"` or a named function starts the answer inside a call (the call's
opening marker is appended to the prompt), so the model cannot answer in prose.
"""

from __future__ import annotations

import json
import logging
import uuid
from dataclasses import dataclass, field
from typing import Any

import msgspec
from mlx_lm.generate import TextStateMachine

from contract.openai_schemas import ChatCompletionRequest, FunctionCall, NamedToolChoice, ToolCall
from serving.api.errors import invalid

log = logging.getLogger(__name__)
CHOICES = ("none", "auto", "required")


@dataclass(frozen=True)
class ToolPlan:
    """What a request asks of tools: the template's tools and whether a call must open."""

    tools: list[dict[str, Any]] | None  # None: render and parse without tools
    open_call: bool = False
    parallel: bool = True


def plan_tools(req: ChatCompletionRequest, tokenizer: Any) -> ToolPlan:
    choice = req.tool_choice
    if isinstance(choice, str) and choice not in CHOICES:
        raise invalid(f"tool_choice must be one of {', '.join(CHOICES)} or a function",
                      "tool_choice")
    if isinstance(choice, NamedToolChoice) and choice.type != "function":
        raise invalid("tool_choice.type must be 'function'", "tool_choice.type")
    for i, tool in enumerate(req.tools or []):
        if tool.type != "function":
            raise invalid("Only function tools are supported", f"tools[{i}].type")
    named = choice.function.name if isinstance(choice, NamedToolChoice) else None
    return make_plan(
        [msgspec.to_builtins(t) for t in req.tools or []],
        "required" if named or isinstance(choice, NamedToolChoice) else choice,
        named,
        req.parallel_tool_calls is not False,
        tokenizer,
        "tool_choice.function.name",
    )


def make_plan(
    tools: list[dict[str, Any]],
    choice: str | None,
    named: str | None,
    parallel: bool,
    tokenizer: Any,
    named_param: str,
) -> ToolPlan:
    """The plan of OpenAI-shaped function `tools` under `choice` ("none", "auto",
    "required" or None for none given), narrowed to the function `named`."""
    if not tools:
        if choice not in (None, "none"):
            raise invalid("tool_choice needs tools", "tool_choice")
        return ToolPlan(None)
    if choice == "none":
        return ToolPlan(None)
    if not getattr(tokenizer, "has_tool_calling", False):
        if choice in (None, "auto"):
            # Coding agents send tools on every request; under "auto" the model may answer
            # in text anyway, so a model that cannot call tools answers without them.
            log.info("this model's template has no tool calling: %d tools left out",
                     len(tools))
            return ToolPlan(None)
        raise invalid(
            "This model's chat template does not support tool calling; leave out tools",
            "tools",
            "unsupported_parameter",
        )
    if named is not None:
        tools = [t for t in tools if t["function"]["name"] == named]
        if not tools:
            raise invalid(f"tool_choice names {named!r}, which is not in tools", named_param)
    return ToolPlan(tools, open_call=choice == "required", parallel=parallel)


@dataclass
class ToolCallStream:
    """Splits generated text into content and tool calls, as it arrives."""

    tokenizer: Any
    plan: ToolPlan
    calls: list[ToolCall] = field(default_factory=list)
    _machine: Any = None
    _state: Any = None
    _call_text: str = ""

    def __post_init__(self) -> None:
        if self.plan.tools is None:
            return
        start, end = self.tokenizer.tool_call_start, self.tokenizer.tool_call_end
        self._machine = TextStateMachine(
            {"normal": [(start, "tool")], "tool": [(end, "normal")] if end else []}
        )
        self._state = self._machine.make_state("tool" if self.plan.open_call else "normal")

    def feed(self, text: str) -> tuple[str, list[ToolCall]]:
        """Content safe to send now, and the calls that completed in this text."""
        if self._machine is None:
            return text, []
        self._state, segments = TextStateMachine.split(self._state, text)
        return self._consume(segments)

    def finish(self) -> tuple[str, list[ToolCall]]:
        """The held-back rest, and a call left open by the end of the text."""
        if self._machine is None:
            return "", []
        self._state, rest, state = TextStateMachine.flush(self._state)
        content, calls = self._consume([(state, rest)])
        if self._call_text:  # no closing marker (a parser without one, or cut short)
            more, extra = self._close_call()
            content, calls = content + more, calls + extra
        return content, calls

    def _consume(self, segments: list[tuple[str, str]]) -> tuple[str, list[ToolCall]]:
        content, calls = "", list[ToolCall]()
        for i, (state, text) in enumerate(segments):
            if state == "tool":
                self._call_text += text
                continue
            if i > 0 and segments[i - 1][0] == "tool":  # a call just closed
                more, made = self._close_call()
                content, calls = content + more, calls + made
            content += text
        return content, calls

    def _close_call(self) -> tuple[str, list[ToolCall]]:
        text, self._call_text = self._call_text, ""
        try:
            parsed = self.tokenizer.tool_parser(text, self.plan.tools)
        except (ValueError, KeyError, TypeError) as exc:  # json.JSONDecodeError is a ValueError
            log.warning("unparsable tool call (%s); returned as text", exc)
            return self.tokenizer.tool_call_start + text, []
        made = [_as_call(p) for p in (parsed if isinstance(parsed, list) else [parsed])]
        if not self.plan.parallel:
            made = made[: max(0, 1 - len(self.calls))]
        self.calls.extend(made)
        return "", made


def _as_call(parsed: dict[str, Any]) -> ToolCall:
    arguments = parsed.get("arguments", {})
    if not isinstance(arguments, str):
        arguments = json.dumps(arguments, ensure_ascii=False)
    return ToolCall(f"call_{uuid.uuid4().hex[:24]}", FunctionCall(str(parsed["name"]), arguments))
