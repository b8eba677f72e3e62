"""Greedy output of plain mlx-lm (its own stream_generate, which mlx_lm.generate wraps) on a
model directory: a reference none of our serving code takes part in, so a bug common to
every rank count cannot cancel out."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Reference:
    tokens: list[int]
    text: str
    logprobs: list[float]  # of each chosen token, log-softmax of the raw logits
    stopped: bool  # ended on EOS (which, as vLLM and our ranks do, counts as a token)

    @property
    def completion_tokens(self) -> int:
        return len(self.tokens) + self.stopped


def load(model_dir: Path) -> tuple[Any, Any]:
    """(model, tokenizer) as mlx_lm.load gives them."""
    import mlx_lm

    model, tokenizer = mlx_lm.load(str(model_dir))[:2]
    return model, tokenizer


def chat_prompt(tokenizer: Any, content: str) -> list[int]:
    """One user turn through the model's chat template, as rank 0 renders it."""
    messages = [{"role": "user", "content": content}]
    return list(tokenizer.apply_chat_template(messages, add_generation_prompt=True))


def greedy(
    model: Any, tokenizer: Any, prompt: list[int], max_tokens: int,
    prefill_step_size: int = 2048, logits_processors: list[Any] | None = None,
) -> Reference:
    """Argmax decoding of up to max_tokens (ends at EOS, as ranks do); the whole prompt is
    prefilled in chunks of prefill_step_size (larger than the prompt: in one pass);
    `logits_processors` as mlx_lm.sample_utils.make_logits_processors makes them."""
    stream_generate = sys.modules["mlx_lm.generate"].stream_generate  # the module, not the fn
    tokens: list[int] = []
    logprobs: list[float] = []
    text, stopped = "", False
    for response in stream_generate(
        model, tokenizer, prompt, max_tokens=max_tokens, prefill_step_size=prefill_step_size,
        logits_processors=logits_processors,
    ):
        text += response.text
        if response.finish_reason == "stop":
            stopped = True  # the EOS token is not part of the text (on the ranks neither)
            break
        tokens.append(int(response.token))
        logprobs.append(float(response.logprobs[response.token]))
    return Reference(tokens, text, logprobs, stopped)
