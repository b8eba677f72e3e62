"""The Messages API's reasoning fields mapped onto a local model: `thinking`,
`output_config.effort`, `context_management`'s clear_thinking edits, and the thinking
blocks a client sends back (signatures checked, serving/api/thinking_signature.py).

- `thinking: {"type": "disabled"}` renders the prompt with the template's thinking switch
  off (`enable_thinking: false`); "enabled" and "adaptive" with it on; absent: the
  template's own default. `budget_tokens` ("enabled") is a ceiling on the reasoning's
  tokens; `display: "omitted"` sends the thinking text empty (the signature carries it).
- `output_config.effort` sets the reasoning's ceiling when `budget_tokens` does not:
  EFFORT_BUDGETS (None: no ceiling but max_tokens).
- Earlier turns' thinking reaches the template as `reasoning_content` (the name Qwen3,
  DeepSeek and GLM templates read) for the assistant turns a clear_thinking edit keeps
  (default: the last one); the template decides what it shows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from contract.anthropic_schemas import (
    ContextEdit,
    InputMessage,
    PromptFields,
    RedactedThinkingBlock,
    ThinkingBlock,
)
from serving.api.errors import invalid
from serving.api.thinking_signature import BadSignature, verify

THINKING_TYPES = ("enabled", "adaptive", "disabled")
DISPLAYS = (None, "summarized", "omitted")
# Reasoning tokens per effort level; None: no ceiling but max_tokens.
EFFORT_BUDGETS: dict[str, int | None] = {
    "low": 1024, "medium": 4096, "high": None, "xhigh": None, "max": None,
}
KEEP_DEFAULT = 1  # clear_thinking without `keep`: Anthropic keeps the last assistant turn


@dataclass(frozen=True)
class ThinkingPlan:
    enabled: bool | None  # the template's thinking switch; None: its default
    budget: int | None  # ceiling on reasoning tokens; None: none
    omitted: bool  # display "omitted": thinking text left out of the answer
    keep_turns: int | None  # assistant turns whose thinking stays in the prompt; None: all


def thinking_plan(req: PromptFields) -> ThinkingPlan:
    """The request's thinking fields checked (400s name the field) and combined."""
    thinking, config = req.thinking, req.output_config
    effort = config.effort if config else None
    if effort is not None and effort not in EFFORT_BUDGETS:
        raise invalid(f"output_config.effort must be one of {', '.join(EFFORT_BUDGETS)}",
                      "output_config.effort")
    budget = EFFORT_BUDGETS[effort] if effort else None
    enabled, omitted = None, False
    if thinking is not None:
        if thinking.type not in THINKING_TYPES:
            raise invalid(f"thinking.type must be one of {', '.join(THINKING_TYPES)}",
                          "thinking.type")
        if thinking.display not in DISPLAYS:
            raise invalid("thinking.display must be summarized or omitted", "thinking.display")
        if thinking.budget_tokens is not None:
            if thinking.budget_tokens < 1:
                raise invalid("thinking.budget_tokens must be at least 1",
                              "thinking.budget_tokens")
            budget = thinking.budget_tokens
        enabled, omitted = thinking.type != "disabled", thinking.display == "omitted"
    return ThinkingPlan(enabled, budget, omitted, _keep_turns(req))


def _keep_turns(req: PromptFields) -> int | None:
    edits = (req.context_management.edits or []) if req.context_management else []
    keep: int | None = None
    for i, edit in enumerate(edits):
        if not edit.type.startswith("clear_thinking_"):
            raise invalid(
                f"context_management edit {edit.type!r} is not supported by this server "
                "(only clear_thinking_*); leave it out",
                f"context_management.edits.{i}.type", "unsupported_parameter")
        keep = _keep_of(i, edit)
    return keep if edits else None


def _keep_of(i: int, edit: ContextEdit) -> int | None:
    keep = edit.keep
    if keep is None:
        return KEEP_DEFAULT
    if keep == "all" or (isinstance(keep, dict) and keep.get("type") == "all"):
        return None
    value = keep.get("value") if isinstance(keep, dict) else None
    if isinstance(keep, dict) and keep.get("type") == "thinking_turns" and (
            isinstance(value, int) and value >= 0):
        return value
    raise invalid('keep must be "all", {"type": "all"} or {"type": "thinking_turns", '
                  '"value": N}', f"context_management.edits.{i}.keep")


def turn_reasoning(key: bytes, messages: list[InputMessage],
                   keep_turns: int | None) -> dict[int, str]:
    """Every thinking block sent back is checked (a forged one is a 400 naming it); the
    reasoning text of the assistant turns kept, by message index."""
    assistant = [i for i, m in enumerate(messages) if m.role == "assistant"]
    kept = set(assistant if keep_turns is None else assistant[len(assistant) - keep_turns:]
               if keep_turns else [])
    out: dict[int, str] = {}
    for i, message in enumerate(messages):
        if isinstance(message.content, str):
            continue
        for j, block in enumerate(message.content):
            text = _checked(key, block, f"messages.{i}.content.{j}")
            if text is not None and i in kept:
                out[i] = out.get(i, "") + text
    return out


def _checked(key: bytes, block: Any, where: str) -> str | None:
    if isinstance(block, RedactedThinkingBlock):
        raise invalid("redacted_thinking blocks are not made by this server", where)
    if not isinstance(block, ThinkingBlock):
        return None
    try:
        return verify(key, block.signature, block.thinking)
    except BadSignature as exc:
        raise invalid(f"invalid thinking signature: {exc}", f"{where}.signature") from exc


def template_kwargs(plan: ThinkingPlan) -> dict[str, Any]:
    """The chat template's thinking switch (mlx-lm's wrapper renames it for templates
    that call it `thinking`)."""
    return {} if plan.enabled is None else {"enable_thinking": plan.enabled}
