"""An answer's `timings` (llama.cpp server's shape) from the engine's Finished event."""

from __future__ import annotations

from contract.openai_schemas import Timings
from serving.engine.requests import Finished


def timings_of(done: Finished) -> Timings:
    """Prompt: from joining the batch to the first token (prefill, chunked or not, sharing
    steps with other requests); predicted: from the first token to the last."""
    prompt_ms, predicted_ms = done.prompt_s * 1e3, done.generation_s * 1e3
    return Timings(
        prompt_n=done.prompt_tokens,
        prompt_ms=prompt_ms,
        prompt_per_token_ms=_per(prompt_ms, done.prompt_tokens),
        prompt_per_second=_rate(done.prompt_tokens, prompt_ms),
        predicted_n=done.completion_tokens,
        predicted_ms=predicted_ms,
        predicted_per_token_ms=_per(predicted_ms, done.completion_tokens),
        predicted_per_second=_rate(done.completion_tokens, predicted_ms),
    )


def _per(ms: float, n: int) -> float:
    return ms / n if n else 0.0


def _rate(n: int, ms: float) -> float:
    return n * 1e3 / ms if ms > 0 else 0.0
