"""The batch every rank mirrors: an mlx-lm BatchGenerator driven by StepPlans.

Rank 0 and the workers call the same methods in the same order, so BatchGenerator
assigns the same uids and produces the same tokens on every rank.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.generate import BatchGenerator
from mlx_lm.generate_utils import BatchStats
from mlx_lm.models.cache import LRUPromptCache, can_trim_prompt_cache, trim_prompt_cache

from serving.engine.grammar import GrammarCompiler
from serving.engine.kv_budget import KvBudget
from serving.engine.kv_quant import fresh_cache
from serving.engine.sampling import make_request_processors, make_request_sampler
from serving.engine.step_plan import Insert

_MASK63 = (1 << 63) - 1


@dataclass(frozen=True)
class TokenEvent:
    uid: int
    token: int
    finish_reason: str | None  # "stop" (EOS) / "length" (max_tokens) / None
    logprobs: mx.array | None = None  # over the vocabulary, after the logits processors


def digest_ints(values: list[int]) -> int:
    """A 63-bit digest of a list of ints (fits the int64 plan header)."""
    raw = struct.pack(f"<{len(values)}q", *values)
    return int.from_bytes(hashlib.blake2b(raw, digest_size=8).digest(), "little") & _MASK63


class MirroredBatch:
    """BatchGenerator plus the bookkeeping the StepPlan protocol needs."""

    def __init__(
        self,
        model: nn.Module,
        eos_token_ids: set[int],
        vocab_size: int,
        max_batch_size: int,
        prefill_step_size: int,
        prompt_cache_size: int = 0,
        prompt_cache_bytes: int = 1 << 62,
        grammars: GrammarCompiler | None = None,
        kv: KvBudget | None = None,
        rank: int = 0,
        kv_bits: int | None = None,
        kv_group_size: int = 64,
        kv_window: int = 0,
    ) -> None:
        self.model = model
        # [serving] kv_bits: new sequences start from quantized caches (serving/engine/kv_quant.py)
        self.kv_quant = (kv_bits, kv_group_size, kv_window) if kv_bits else None
        self.vocab_size = vocab_size
        self.grammars = grammars  # structured outputs' masks (None: grammars are ignored)
        self.max_prefill_chunk = prefill_step_size
        self.eos_token_id = min(eos_token_ids, default=0)  # what a forced output ends with
        self.generator = BatchGenerator(
            model,
            stop_tokens=[[t] for t in sorted(eos_token_ids)],
            completion_batch_size=max_batch_size,
            prefill_batch_size=min(max_batch_size, 8),
            prefill_step_size=prefill_step_size,
        )
        # Live uids in insertion order -> prompt tokens each reused from the prefix cache.
        self.active: dict[int, int] = {}
        # Prefix cache of finished sequences' KV (this rank's shard). Every rank inserts,
        # looks up and evicts alike: the same entries in the same order, under byte bounds
        # agreed at start-up in proportion to each rank's entry size (equal in tensor mode,
        # per layer in pipeline mode: serving/rank/startup.py). What each insert reused is
        # in the batch fingerprint, so a rank that decided otherwise is a desync at the
        # next plan.
        self.prompt_cache = (
            LRUPromptCache(max_size=prompt_cache_size, max_bytes=prompt_cache_bytes)
            if prompt_cache_size and prompt_cache_bytes else None
        )
        # Admission by KV budget: each live sequence's prompt + max_tokens, and the budget
        # the prefix cache shares with them (serving/engine/kv_budget.py).
        self.kv, self.rank = kv, rank
        self.needs: dict[int, int] = {}
        self._prefix_bound = prompt_cache_bytes
        self.cached_tokens = 0  # prompt tokens served from the prefix cache (for logs/metrics)
        self.cache_hits = 0  # inserts that reused at least one token

    @property
    def stream(self) -> mx.Stream:
        return self.generator.stream

    def apply(self, inserts: list[Insert], removes: list[int]) -> list[int]:
        """Apply one plan's removes then inserts; returns the new uids in insert order."""
        live_removes = [uid for uid in removes if uid in self.active]
        if live_removes:
            self.generator.remove(live_removes)
            for uid in live_removes:
                del self.active[uid]
                self.needs.pop(uid, None)
        if not inserts:
            self._bound_prefix_cache()
            return []
        reuse = [self._reuse(ins.prompt) for ins in inserts]
        caches: list[Any] = [cache or self._fresh_cache() for cache, _, _ in reuse]
        uids: list[int] = self.generator.insert(
            [rest for _, rest, _ in reuse],
            max_tokens=[ins.params.max_tokens for ins in inserts],
            caches=caches,
            all_tokens=[done for _, _, done in reuse],
            samplers=[make_request_sampler(ins.params, self.vocab_size, self.eos_token_id)
                      for ins in inserts],
            logits_processors=[
                make_request_processors(ins.params, self.eos_token_id, self.grammars)
                for ins in inserts
            ],
        )
        self.active.update(zip(uids, (len(done) for _, _, done in reuse), strict=True))
        self.needs.update(
            zip(uids, (len(i.prompt) + i.params.max_tokens for i in inserts), strict=True))
        self._bound_prefix_cache()
        return uids

    def _bound_prefix_cache(self) -> None:
        """Evict prefix entries the running sequences' KV needs room for (every rank alike)."""
        if self.prompt_cache is None or self.kv is None:
            return
        room = self.kv.prefix_room(self.rank, self.needs.values())
        self.prompt_cache.max_bytes = min(self._prefix_bound, room)
        self.prompt_cache.trim_to(n_bytes=self.prompt_cache.max_bytes)

    def _fresh_cache(self) -> list[Any] | None:
        """A new sequence's cache: None lets the generator make mlx-lm's own."""
        if self.kv_quant is None:
            return None
        return fresh_cache(self.model, *self.kv_quant)

    def _reuse(self, prompt: list[int]) -> tuple[list[Any] | None, list[int], list[int]]:
        """(KV cache or None, tokens still to prefill, tokens the cache already holds)."""
        if self.prompt_cache is None:
            return None, prompt, []
        cache, rest = self.prompt_cache.fetch_nearest_cache("model", prompt)
        if cache is None:
            return None, prompt, []
        if not rest:  # the whole prompt is cached: recompute its last token for logits
            if not can_trim_prompt_cache(cache):
                return None, prompt, []
            trim_prompt_cache(cache, 1)
            rest = prompt[-1:]
        done = prompt[: len(prompt) - len(rest)]
        self.cached_tokens += len(done)
        self.cache_hits += 1
        return cache, rest, done

    @property
    def prompt_cache_bytes(self) -> int:
        return self.prompt_cache.nbytes if self.prompt_cache is not None else 0

    def fingerprint(self, perturb: bool = False) -> int:
        """Digest of the batch composition: the live uids in insertion order, each with the
        prompt tokens it reused from the prefix cache.

        Kept from our own bookkeeping, not BatchGenerator internals; a divergence inside
        the generator shows up in the next plan's token digest instead.
        """
        parts = [value for item in self.active.items() for value in item]
        if perturb:  # fault injection: this rank now believes in a phantom sequence
            parts.append(-2)
        return digest_ints(parts)

    @contextmanager
    def stats(self) -> Iterator[BatchStats]:
        """mlx-lm's counters of the work done inside the block (prefill tokens and time)."""
        with self.generator.stats() as stats:
            yield stats

    def step(self, prefill_chunk: int = 0) -> list[TokenEvent]:
        """One engine step: decode the running sequences, then prefill the next
        `prefill_chunk` tokens (0: the most allowed) of each sequence still prefilling."""
        # BatchGenerator cuts each step's chunk by this attribute (mlx-lm 0.32).
        self.generator.prefill_step_size = prefill_chunk or self.max_prefill_chunk
        _, responses = self.generator.next()
        events = [
            TokenEvent(r.uid, int(r.token), r.finish_reason, r.logprobs) for r in responses
        ]
        for r in responses:
            if r.finish_reason is not None:
                self.finished(r.uid, r.all_tokens, r.prompt_cache)
        return events

    def finished(self, uid: int, all_tokens: list[int] | None, cache: list[Any] | None) -> None:
        """A sequence the generator dropped: its KV goes to the prefix cache."""
        self.active.pop(uid, None)
        self.needs.pop(uid, None)
        self._bound_prefix_cache()
        if self.prompt_cache is not None and cache is not None and all_tokens is not None:
            self.prompt_cache.insert_cache("model", list(all_tokens), cache)

    def close(self) -> None:
        self.generator.close()
