"""Per-request samplers that every rank can reproduce exactly.

Each sampled request owns an explicit PRNG key derived from its seed, so the tokens
do not depend on how many other requests share the batch or on any global random
state: every rank draws the same token from the same (all_sum'd, identical) logits.
"""

from __future__ import annotations

from collections.abc import Callable

import mlx.core as mx
from mlx_lm.sample_utils import apply_top_k, apply_top_p, greedy_sampler

from serving.engine.step_plan import SamplingParams

Sampler = Callable[[mx.array], mx.array]


def make_request_sampler(params: SamplingParams, vocab_size: int) -> Sampler:
    """The sampler for one request: greedy at temperature 0, else seeded categorical."""
    if params.temperature == 0:
        return greedy_sampler  # shared object: the batch samples in one call
    key = mx.random.key(params.seed)
    inv_temp = 1.0 / params.temperature
    top_p = params.top_p
    top_k = params.top_k if 0 < params.top_k < vocab_size else 0

    def sample(logprobs: mx.array) -> mx.array:
        nonlocal key
        if 0 < top_p < 1.0:
            logprobs = apply_top_p(logprobs, top_p)
        if top_k:
            logprobs = apply_top_k(logprobs, top_k)
        key, subkey = mx.random.split(key)
        return mx.random.categorical(logprobs * inv_temp, key=subkey)

    return sample
