"""A ceiling on a request's reasoning (Anthropic's `thinking.budget_tokens`, `effort`):
after `budget` tokens inside the model's thinking markers, the end marker's tokens are
forced, so the model goes on to its answer. A logits processor built from the plan's
parameters, so every rank forces the same tokens at the same step."""

from __future__ import annotations

from collections.abc import Callable

import mlx.core as mx

LogitsProcessor = Callable[[mx.array, mx.array], mx.array]


def reasoning_budget(budget: int, start: list[int], end: list[int],
                     inside: bool) -> LogitsProcessor:
    """`start` / `end`: the thinking markers' tokens; `inside`: the prompt opened the
    reasoning. Reads the last token of the context on each step (one small sync, for the
    requests that ask for a ceiling only)."""
    state = {"inside": inside, "count": 0, "closing": -1}

    def close(context: mx.array, logits: mx.array) -> mx.array:
        if state["closing"] < 0:
            last = int(context[-1].item()) if context.size else -1  # type: ignore[arg-type]
            if start and last == start[-1]:
                state["inside"], state["count"] = True, 0
            elif last == end[-1]:
                state["inside"] = False
            if not state["inside"]:
                return logits
            if state["count"] < budget:
                state["count"] += 1
                return logits
            state["closing"] = 0
        token = end[state["closing"]]
        state["closing"] += 1
        if state["closing"] == len(end):
            state["closing"], state["inside"] = -1, False
        return mx.where(mx.arange(logits.shape[-1]) == token, 0.0, -mx.inf)[None].astype(
            logits.dtype)

    return close
