"""Chat completions' reasoning fields: `reasoning_effort` and `chat_template_kwargs` onto
the chat template's switches. The answer's reasoning is split off by
serving/api/reasoning.py and sent as `reasoning_content` (vLLM's and DeepSeek's name)."""

from __future__ import annotations

from typing import Any

from contract.openai_schemas import ChatCompletionRequest
from serving.api.errors import invalid

# The template's thinking switch per effort ("none" / "minimal": no reasoning).
EFFORTS = {"none": False, "minimal": False, "low": True, "medium": True, "high": True,
           "xhigh": True}
# Arguments the server itself passes to apply_chat_template: not the client's to set.
RESERVED = ("messages", "conversation", "tools", "documents", "add_generation_prompt",
            "continue_final_message", "tokenize", "return_dict", "chat_template")


def template_kwargs(req: ChatCompletionRequest) -> dict[str, Any]:
    """The template's keyword arguments: `chat_template_kwargs` as given, and the thinking
    switch `reasoning_effort` implies unless they set it."""
    given = dict(req.chat_template_kwargs or {})
    for name in given:
        if name in RESERVED:
            raise invalid(f"chat_template_kwargs may not set {name!r} (the server does)",
                          f"chat_template_kwargs.{name}")
    effort = req.reasoning_effort
    if effort is not None:
        if effort not in EFFORTS:
            raise invalid(f"reasoning_effort must be one of {', '.join(EFFORTS)}",
                          "reasoning_effort")
        given.setdefault("enable_thinking", EFFORTS[effort])
    return given
