"""Speculative decoding across ranks, for one running sequence.

Rank 0 proposes up to k draft tokens (prompt lookup, serving/engine/draft_lookup.py) at
the start of a step and broadcasts them (StepPlan drafts message); every rank feeds the
pending token and the drafts through the model in one forward pass, keeps the drafts
the model itself would have chosen (greedy: each draft equal to the previous position's
argmax; sampled: the standard accept/reject rule, drawn from the request's own key),
and trims its KV cache back to what it kept. The logits are identical on every
rank (tensor all_sum, pipeline all_gather), so every rank accepts alike; rank 0's count
travels in the next plan and a worker whose count differs exits DESYNC.

Only when exactly one sequence runs, without logits processors: that is the
one-person / one-agent case where a decode step is bound by memory bandwidth and the
hardware verifies k+1 tokens in about the time of one. With several sequences a step
already reads the weights once for all of them, verifying drafts would multiply the
compute of every sequence by k+1, and a shared forward would need per-sequence trims
of mlx-lm's batch cache; normal batched steps serve them. Requests with penalties or
logit bias take normal steps too (their processors see one token at a time).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx_lm.models.cache import KVCache, make_prompt_cache
from mlx_lm.sample_utils import greedy_sampler

from serving.engine import draft_lookup
from serving.engine.batch import MirroredBatch, TokenEvent
from serving.engine.sampling import SeededSampler
from serving.engine.step_plan import SamplingParams


class DraftProposer(Protocol):
    """A draft model's proposals (serving/engine/draft_model.py)."""

    def propose(self, tokens: list[int], k: int) -> list[int]: ...
    def reset(self) -> None: ...


class SpeculationUnsupported(Exception):
    """This model cannot speculate (its cache cannot be trimmed back)."""


class NotSpeculating(Exception):
    """Drafts arrived for a step this rank's batch cannot verify: out of step with rank 0."""


def check_model(model: nn.Module) -> None:
    """Refuse a model whose layers keep a cache that cannot be trimmed back by a count
    of tokens (sliding-window, rotating, linear-attention or state-space layers)."""
    kinds = {type(cache).__name__ for cache in make_prompt_cache(model)}
    if kinds != {KVCache.__name__}:
        raise SpeculationUnsupported(
            f"[serving] speculative needs a KV cache that can be trimmed back, and this "
            f"model's layers keep {', '.join(sorted(kinds))}: set speculative = \"off\""
        )


def wants_speculation(params: SamplingParams) -> bool:
    """A request speculation serves: greedy or sampled, no logits processors of any kind."""
    return (
        not params.forced and not params.logit_bias
        and params.repetition_penalty == 1.0 and not params.presence_penalty
        and not params.frequency_penalty and params.reasoning_budget < 0
    )


def _single_sequence(batch: MirroredBatch) -> Any | None:
    """The generation batch when it holds the only sequence, without processors, with
    its next token pending; None otherwise."""
    gen = batch.generator
    gb = gen._generation_batch
    if len(gb) != 1 or len(gen._prompt_batch) or gen._unprocessed_sequences:
        return None
    if gb._next_tokens is None or any(gb.logits_processors[0] or ()):
        return None
    sampler = gb.samplers[0] if gb.samplers else None
    if sampler not in (None, greedy_sampler) and not isinstance(sampler, SeededSampler):
        return None
    return gb


def known_tokens(batch: MirroredBatch) -> list[int] | None:
    """The tokens rank 0 already has for the one sequence that could speculate (its
    prompt and what it emitted, not the pending token: no wait for the device); None
    when no such sequence runs. The list is the batch's own: read it, do not keep it."""
    gb = _single_sequence(batch)
    return None if gb is None else gb.tokens[0]


def draft_budget(batch: MirroredBatch, slots: int) -> tuple[list[int], int] | None:
    """(the sequence's tokens so far including the pending one, how many drafts fit
    before its max_tokens) when this step can speculate; None when it cannot."""
    with mx.stream(batch.stream):
        gb = _single_sequence(batch)
        if gb is None:
            return None
        pending = int(gb._next_tokens.item())
    room = gb.max_tokens[0] - gb._num_tokens[0] - 1
    return [*gb.tokens[0], pending], min(slots, room)


@dataclass(frozen=True)
class Verified:
    events: list[TokenEvent]
    accepted: int  # drafts kept


def sampled_rule(
    sampler: SeededSampler, logprobs: mx.array, drafts: list[int]
) -> tuple[int, mx.array]:
    """The standard accept/reject rule for drafts proposed with certainty (prompt lookup):
    keep draft i with probability p_i(draft), p_i the request's own distribution there;
    at the first rejection sample from p_i without the rejected draft, else from the
    position after the last draft. Every emitted token is then distributed as plain
    sampling would draw it; the draws come from the request's key, alike on every rank.
    Returns (accepted, the next token, shape (1,))."""
    k = len(drafts)
    scaled = sampler.scaled(logprobs)
    probs = mx.softmax(scaled[:k], axis=-1)
    p_drafts = mx.take_along_axis(probs, mx.array(drafts)[:, None], axis=-1)[:, 0]
    draws = mx.random.uniform(shape=(k,), key=sampler.next_key())
    kept = np.array(draws < p_drafts).tolist()
    accepted = kept.index(False) if False in kept else k
    row = scaled[accepted]
    if accepted < k:
        row = mx.where(mx.arange(row.shape[-1]) == drafts[accepted], -mx.inf, row)
    token = mx.random.categorical(row, key=sampler.next_key())
    return accepted, token.astype(mx.uint32)[None]


def accepted_count(drafts: list[int], targets: list[int]) -> int:
    """Greedy rule: drafts kept while each equals the model's choice at its position
    (targets[i] is the argmax after the pending token and drafts[:i])."""
    count = 0
    for draft, target in zip(drafts, targets, strict=False):
        if draft != target:
            break
        count += 1
    return count


def verify(batch: MirroredBatch, drafts: list[int], misaccept: bool = False) -> Verified:
    """Feed the pending token and `drafts` in one forward pass, keep the accepted prefix,
    trim the cache back, and return the tokens emitted (the pending one, then the kept
    drafts, up to a finish). `misaccept`: fault injection, count one draft differently."""
    with mx.stream(batch.stream):
        gb = _single_sequence(batch)
        if gb is None:
            raise NotSpeculating("drafts arrived but this rank's batch cannot speculate")
        pending = gb._next_tokens
        inputs = mx.concatenate([pending, mx.array(drafts, dtype=pending.dtype)])[None]
        logits = gb.model(inputs, cache=gb.prompt_cache)[0]
        logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        accepted, following = _accept(gb, logprobs, drafts)
        if misaccept:
            accepted = (accepted + 1) % (len(drafts) + 1)
        rows = [gb._next_logprobs[0], *(logprobs[i] for i in range(accepted))]
        emitted = [int(pending.item()), *drafts[:accepted]]
        events = _advance(batch, gb, emitted, rows, len(drafts) + 1)
        if events[-1].finish_reason is None:
            gb._next_tokens = following
            gb._next_logprobs = [logprobs[accepted]]
            mx.async_eval(gb._next_tokens, gb._next_logprobs)
    return Verified(events, accepted)


def _accept(gb: Any, logprobs: mx.array, drafts: list[int]) -> tuple[int, mx.array]:
    """(drafts accepted, the token after them) by the request's own rule."""
    sampler = gb.samplers[0] if gb.samplers else None
    if isinstance(sampler, SeededSampler):
        return sampled_rule(sampler, logprobs, drafts)
    targets = mx.argmax(logprobs, axis=-1)
    accepted = accepted_count(drafts, [int(t) for t in np.array(targets)])
    return accepted, targets[accepted : accepted + 1]


def _advance(
    batch: MirroredBatch, gb: Any, emitted: list[int], rows: list[mx.array], fed: int
) -> list[TokenEvent]:
    """Emit tokens up to the first finish (as GenerationBatch.next would, one by one),
    trim the cache to what was emitted, and drop a finished sequence."""
    events: list[TokenEvent] = []
    uid = gb.uids[0]
    for token, row in zip(emitted, rows, strict=True):
        gb._num_tokens[0] += 1
        finish = "length" if gb._num_tokens[0] >= gb.max_tokens[0] else None
        if gb._matchers[0].advance(token):
            finish = "stop"
        events.append(TokenEvent(uid, token, finish, row))
        if finish is not None:
            break
    for cache in gb.prompt_cache:
        cache.trim(fed - len(events))
    gb.tokens[0].extend(event.token for event in events)
    if events[-1].finish_reason is not None:
        batch.finished(uid, gb.tokens[0], gb.extract_cache(0))
        gb.filter([])
    return events


class Speculator:
    """Rank 0's side: which steps speculate, the drafts, the counters."""

    def __init__(
        self, num_draft_tokens: int, metrics: Any, draft: DraftProposer | None = None
    ) -> None:
        self.slots = num_draft_tokens
        self._metrics = metrics
        self._draft = draft  # None: prompt lookup
        self._policy = draft_lookup.LookupPolicy(num_draft_tokens)  # prompt lookup's steps
        self.last_accepted = 0  # in the latest finished step (the next plan carries it)

    def slots_for(
        self, running: list[SamplingParams], changes_batch: bool,
        known: list[int] | None = None,
    ) -> int:
        """The next step's draft slots: 0 (a normal step) unless one sequence without
        logits processors runs alone and the plan leaves the batch as it is; then k with
        a draft model, and with prompt lookup what its policy says from the tokens rank 0
        already knows (`known`, see known_tokens)."""
        alone = len(running) == 1 and not changes_batch
        if not (alone and wants_speculation(running[0])):
            self._policy.reset()
            if self._draft is not None:
                self._draft.reset()  # the sequence ended or has company: its cache goes
            return 0
        return self.slots if self._draft is not None else self._policy.slots(known)

    def propose(self, batch: MirroredBatch, slots: int, channel: Any) -> list[int]:
        """At the start of a step with draft slots: rank 0's drafts, sent to the workers
        (none when the sequence finished or is still reading its prompt). A draft model
        proposes greedily, so each draft is certain given the text before it: the accept
        rules below hold for its drafts as for prompt lookup's."""
        budget = draft_budget(batch, slots)
        drafts: list[int] = []
        if budget and self._draft is not None:
            with mx.stream(batch.stream):
                drafts = self._draft.propose(*budget)
        elif budget:
            drafts = draft_lookup.propose(*budget)
            if not drafts:  # the pending token broke the match: a miss for the policy
                self._policy.record(0)
        if channel is not None:
            channel.send_drafts(drafts, slots)
        return drafts

    def verify(self, batch: MirroredBatch, drafts: list[int]) -> list[TokenEvent]:
        verified = verify(batch, drafts)
        self.last_accepted = verified.accepted
        if self._draft is None:
            self._policy.record(verified.accepted)
        self._metrics.draft_tokens.inc(len(drafts))
        self._metrics.accepted_tokens.inc(verified.accepted)
        return verified.events
