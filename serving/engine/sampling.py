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

from serving.engine.step_plan import SamplingParams

Sampler = Callable[[mx.array], mx.array]
LogitsProcessor = Callable[[mx.array, mx.array], mx.array]


def make_request_sampler(params: SamplingParams, vocab_size: int) -> Sampler:
    """The sampler for one request: greedy at temperature 0, else seeded categorical."""
    if params.temperature == 0:
        return greedy_sampler  # shared object: the batch samples in one call
    key = mx.random.key(params.seed)
    inv_temp = 1.0 / params.temperature
    top_p = params.top_p
    top_k = params.top_k if 0 < params.top_k < vocab_size else 0
    min_p = params.min_p

    def sample(logprobs: mx.array) -> mx.array:
        nonlocal key
        if 0 < top_p < 1.0:
            logprobs = apply_top_p(logprobs, top_p)
        if min_p > 0:
            logprobs = apply_min_p(logprobs, min_p)
        if top_k:
            logprobs = apply_top_k(logprobs, top_k)
        key, subkey = mx.random.split(key)
        return mx.random.categorical(logprobs * inv_temp, key=subkey)

    return sample


def make_request_processors(
    params: SamplingParams, eos_token_id: int
) -> list[LogitsProcessor]:
    """The request's logits processors (empty for plain sampling: the fast path)."""
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
    if params.forced:
        processors.append(_forcing([*params.forced, eos_token_id]))
    return processors


def _forcing(tokens: list[int]) -> LogitsProcessor:
    """Test aid: emit `tokens` in order whatever the model says (see serving/faults.py)."""
    emitted = 0

    def force(_context: mx.array, logits: mx.array) -> mx.array:
        nonlocal emitted
        token = tokens[min(emitted, len(tokens) - 1)]
        emitted += 1
        return mx.where(mx.arange(logits.shape[-1]) == token, 0.0, -mx.inf)[None].astype(
            logits.dtype
        )

    return force
