"""Token logprobs in OpenAI's two shapes: chat (`content` list) and legacy completions."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from contract.openai_schemas import ChatLogprobs, ChatTokenLogprob, CompletionLogprobs, TopLogprob
from serving.engine.requests import TokenLogprob


def token_text(tokenizer: Any, token: int) -> str:
    return str(tokenizer.decode([token]))


def chat_logprobs(items: Sequence[TokenLogprob], tokenizer: Any) -> ChatLogprobs:
    def top(token: int, logprob: float) -> TopLogprob:
        text = token_text(tokenizer, token)
        return TopLogprob(text, logprob, list(text.encode()))

    content = []
    for item in items:
        text = token_text(tokenizer, item.token)
        content.append(
            ChatTokenLogprob(
                text, item.logprob, list(text.encode()), [top(t, lp) for t, lp in item.top]
            )
        )
    return ChatLogprobs(content)


def completion_logprobs(
    items: Sequence[TokenLogprob], tokenizer: Any, top: int, offset: int = 0
) -> CompletionLogprobs:
    """`offset`: characters of the completion sent before these tokens (streaming)."""
    tokens = [token_text(tokenizer, item.token) for item in items]
    offsets = []
    for text in tokens:
        offsets.append(offset)
        offset += len(text)
    tops = (
        [{token_text(tokenizer, t): lp for t, lp in item.top} for item in items] if top else None
    )
    return CompletionLogprobs(tokens, [item.logprob for item in items], tops, offsets)
