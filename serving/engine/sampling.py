"""Per-request samplers and logits processors that every rank can reproduce exactly.

Each sampled request owns an explicit PRNG key derived from its seed, so the tokens
do not depend on how many other requests share the batch or on any global random
state: every rank draws the same token from the same (all_sum'd, identical) logits.
The processors (penalties, logit bias) are mlx-lm's, built from the plan's parameters,
so every rank applies the same ones to the same tokens.
"""

from __future__ import annotations

from collections.abc import Callable

import mlx.core as mx
from mlx_lm.sample_utils import (
    apply_min_p,
    apply_top_k,
    apply_top_p,
    greedy_sampler,
    make_logits_processors,
)

from serving.engine.grammar import GrammarCompiler
from serving.engine.reasoning_budget import reasoning_budget
from serving.engine.step_plan import SamplingParams

Sampler = Callable[[mx.array], mx.array]
LogitsProcessor = Callable[[mx.array, mx.array], mx.array]


def make_request_sampler(
    params: SamplingParams, vocab_size: int, eos_token_id: int = 0
) -> Sampler:
    """The sampler for one request: greedy at temperature 0, else seeded categorical;
    a forced output (test aid) without a reasoning budget picks its tokens here, so the
    logprobs reported stay the model's own (a teacher-forced perplexity reads them:
    bench/kv_quality.py)."""
    if params.forced and params.reasoning_budget < 0:
        return ForcingSampler([*params.forced, eos_token_id])
    if params.temperature == 0:
        return greedy_sampler  # shared object: the batch samples in one call
    return SeededSampler(params, vocab_size)


class SeededSampler:
    """Categorical sampling after the request's filters, from its own PRNG key (which
    speculative decoding also draws from: serving/engine/speculative.py)."""

    def __init__(self, params: SamplingParams, vocab_size: int) -> None:
        self.key = mx.random.key(params.seed)
        self.inv_temp = 1.0 / params.temperature
        self._top_p = params.top_p
        self._top_k = params.top_k if 0 < params.top_k < vocab_size else 0
        self._min_p = params.min_p

    def next_key(self) -> mx.array:
        self.key, subkey = mx.random.split(self.key)
        return subkey

    def scaled(self, logprobs: mx.array) -> mx.array:
        """The logits this request samples from: filtered, then divided by temperature."""
        if 0 < self._top_p < 1.0:
            logprobs = apply_top_p(logprobs, self._top_p)
        if self._min_p > 0:
            logprobs = apply_min_p(logprobs, self._min_p)
        if self._top_k:
            logprobs = apply_top_k(logprobs, self._top_k)
        return logprobs * self.inv_temp

    def __call__(self, logprobs: mx.array) -> mx.array:
        scaled = self.scaled(logprobs)
        return mx.random.categorical(scaled, key=self.next_key())


def make_request_processors(
    params: SamplingParams, eos_token_id: int, grammars: GrammarCompiler | None = None
) -> list[LogitsProcessor]:
    """The request's logits processors (empty for plain sampling: the fast path). A
    grammar's mask comes after the penalties and bias, so what they leave is masked."""
    processors: list[LogitsProcessor] = list(
        make_logits_processors(
            logit_bias=dict(params.logit_bias) or None,
            repetition_penalty=(
                params.repetition_penalty if params.repetition_penalty != 1.0 else None
            ),
            presence_penalty=params.presence_penalty or None,
            frequency_penalty=params.frequency_penalty or None,
        )
    )
    if params.grammar and grammars is not None:
        processors.append(grammars.processor(params.grammar))
    if params.forced and params.reasoning_budget >= 0:  # else ForcingSampler forces
        processors.append(_forcing([*params.forced, eos_token_id]))
    if params.reasoning_budget >= 0 and params.think_end:  # after forcing: a ceiling wins
        processors.append(reasoning_budget(params.reasoning_budget, params.think_start,
                                           params.think_end, params.in_reasoning))
    return processors


class ForcingSampler:
    """Test aid: emit `tokens` in order whatever the model says (serving/faults.py)."""

    def __init__(self, tokens: list[int]) -> None:
        self._tokens = tokens
        self._emitted = 0

    def __call__(self, logprobs: mx.array) -> mx.array:
        token = self._tokens[min(self._emitted, len(self._tokens) - 1)]
        self._emitted += 1
        return mx.full((logprobs.shape[0],), token, dtype=mx.uint32)


def _forcing(tokens: list[int]) -> LogitsProcessor:
    """Test aid: the forcing as a processor, where a reasoning budget's processor comes
    after it and may override it."""
    emitted = 0

    def force(_context: mx.array, logits: mx.array) -> mx.array:
        nonlocal emitted
        token = tokens[min(emitted, len(tokens) - 1)]
        emitted += 1
        return mx.where(mx.arange(logits.shape[-1]) == token, 0.0, -mx.inf)[None].astype(
            logits.dtype
        )

    return force
