"""The reasoning ceiling's logits processor, step by step without a model."""

from __future__ import annotations

import mlx.core as mx

from serving.engine.reasoning_budget import reasoning_budget

START, END, VOCAB = 7, 8, 16


def run(processor: object, prompt: list[int], wanted: list[int]) -> list[int]:
    """The tokens chosen when the model wants `wanted`, one step at a time."""
    context, out = list(prompt), []
    for token in wanted:
        logits = mx.where(mx.arange(VOCAB) == token, 1.0, 0.0)[None]
        chosen = int(mx.argmax(processor(mx.array(context), logits), axis=-1).item())  # type: ignore[operator]
        context.append(chosen)
        out.append(chosen)
    return out


def test_the_end_marker_is_forced_after_the_budget() -> None:
    """Three reasoning tokens, then the end marker, then the model's own tokens again."""
    assert run(reasoning_budget(3, [START], [END], False), [1],
               [START, 2, 2, 2, 2, 2, 3]) == [START, 2, 2, 2, END, 2, 3]


def test_a_prompt_that_opened_the_reasoning_and_a_multi_token_end() -> None:
    """inside=True counts from the first token; a two-token end marker is forced whole;
    a model that closes in time is left alone."""
    assert run(reasoning_budget(2, [START], [9, END], True), [1],
               [2, 2, 2, 2, 3]) == [2, 2, 9, END, 3]
    assert run(reasoning_budget(5, [START], [END], False), [1],
               [START, 2, END, 3]) == [START, 2, END, 3]
