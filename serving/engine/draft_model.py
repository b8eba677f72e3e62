"""A draft model's proposals for speculative decoding (`[serving] speculative = "draft"`).

Rank 0 alone loads the draft model, whole (unsharded), and runs it without collectives:
the gang's collective order is the target model's alone, and its proposals travel in the
plan exactly as prompt lookup's do (serving/engine/speculative.py), so workers know
nothing of it. It keeps its own KV cache for the one speculating sequence: prefilled with
the sequence's tokens when speculation starts, advanced with the tokens the target kept,
trimmed back to them after a rejection, dropped when no step speculates (the sequence
ended, or a second request joined).
"""

from __future__ import annotations

import logging
import time
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.cache import make_prompt_cache

from contract.settings import RankSettings
from serving.blas import loaded_openblas
from serving.engine.speculative import SpeculationUnsupported, check_model
from serving.model.loading import LoadedModel, ModelLoadError, resolve, tokenizer_options
from serving.model.remote_code import refuse_remote_code

log = logging.getLogger(__name__)
PREFILL_CHUNK = 512  # prompt tokens per forward pass when speculation starts
# Text whose token ids two tokenizers must agree on: words, code, digits, accents.
PROBE = "Hello, world! def add(a, b):\n    return a + b  # 1234 café naïve 東京"


class DraftMismatch(SpeculationUnsupported):
    """The draft model cannot propose tokens the target reads alike (another vocabulary)."""


class DraftModel:
    """Greedy proposals from a small model, with a KV cache kept for one sequence."""

    def __init__(self, model: nn.Module, target_vocab: int) -> None:
        self.model = model
        self._target_vocab = target_vocab  # drafts past the target's logits are not proposed
        self._cache: list[Any] | None = None
        self._fed: list[int] = []  # the tokens the cache holds, in order

    def reset(self) -> None:
        """Drop the sequence's cache (no step speculates now)."""
        self._cache, self._fed = None, []

    def propose(self, tokens: list[int], k: int) -> list[int]:
        """Up to k greedy drafts following `tokens` (the sequence so far, pending token
        last). The cache is first cut back to the longest prefix it shares with `tokens`:
        after a rejection, the drafts the target refused leave it."""
        if k <= 0 or not tokens:
            return []
        common = _common_prefix(self._fed, tokens)
        if self._cache is None or common == 0:
            self._cache, self._fed, common = make_prompt_cache(self.model), [], 0
        common = min(common, len(tokens) - 1)  # the last token is fed again: its logits
        for cache in self._cache:
            cache.trim(len(self._fed) - common)
        del self._fed[common:]
        logits = self._feed(tokens[common:])
        drafts: list[int] = []
        while True:
            token = int(mx.argmax(logits).item())  # type: ignore[arg-type]
            if token >= self._target_vocab:
                break
            drafts.append(token)
            if len(drafts) == k:
                break
            logits = self._feed([token])
        return drafts

    def _feed(self, tokens: list[int]) -> mx.array:
        """Run `tokens` through the draft model into its cache; the last position's logits."""
        assert self._cache is not None
        logits = None
        for start in range(0, len(tokens), PREFILL_CHUNK):
            chunk = tokens[start : start + PREFILL_CHUNK]
            logits = self.model(mx.array(chunk)[None], cache=self._cache)[0, -1]
            mx.eval(logits)
            self._fed.extend(chunk)
        assert logits is not None
        return logits


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def load_draft(settings: RankSettings, target: LoadedModel) -> DraftModel:
    """Load [serving] draft_model whole on this rank (rank 0), resolved as [model] path is
    (a bundled model in float32 where OpenBLAS is loaded), and refuse one whose
    vocabulary differs from the target's or whose cache cannot be trimmed back."""
    from mlx_lm import load as plain_load

    spec = settings.serving.draft_model or ""
    started = time.monotonic()
    try:
        path = resolve(settings, float32=bool(loaded_openblas()), spec=spec)
        trust = settings.model.trust_remote_code
        refuse_remote_code(path, trust)
        model, tokenizer, config = plain_load(  # type: ignore[misc]
            str(path), tokenizer_options(trust), return_config=True, trust_remote_code=trust
        )
    except Exception as exc:
        raise ModelLoadError(f"serving.draft_model {spec!r}: {exc}") from exc
    rows = int(config.get("vocab_size", 0)) or len(tokenizer.vocab)
    differences = vocabulary_differences(tokenizer, rows, target.tokenizer)
    if differences:
        raise DraftMismatch(
            f"serving.draft_model {spec!r} has another vocabulary than model {target.path}: "
            f"{'; '.join(differences)}. Fix: give a draft model of the same tokenizer (the "
            "same family, smaller), or set speculative = \"prompt_lookup\""
        )
    try:
        check_model(model)
    except SpeculationUnsupported as exc:
        raise SpeculationUnsupported(f"serving.draft_model {spec!r}: {exc}") from exc
    log.info("draft model %s loaded on rank 0 in %.2f s", path, time.monotonic() - started)
    return DraftModel(model, target.vocab_size)


def vocabulary_differences(
    draft_tokenizer: Any, draft_rows: int, target_tokenizer: Any
) -> list[str]:
    """What differs between the two vocabularies, in words; [] when they match: the
    tokenizers' sizes, the ids of a probe text and of the end tokens, and whether the
    draft's embedding has a row for every token of its tokenizer."""
    differences = []
    sizes = len(draft_tokenizer.vocab), len(target_tokenizer.vocab)
    if sizes[0] != sizes[1]:
        differences.append(f"its tokenizer has {sizes[0]} tokens, the model's {sizes[1]}")
    probe = [t.encode(PROBE, add_special_tokens=False) for t in (draft_tokenizer, target_tokenizer)]
    if probe[0] != probe[1]:
        differences.append(f"{PROBE!r} encodes as {probe[0][:8]}... vs {probe[1][:8]}...")
    ends = sorted(draft_tokenizer.eos_token_ids), sorted(target_tokenizer.eos_token_ids)
    if ends[0] != ends[1]:
        differences.append(f"end-of-sequence ids {ends[0]} vs {ends[1]}")
    if draft_rows < sizes[0]:
        differences.append(f"its embedding has {draft_rows} rows for {sizes[0]} tokens")
    return differences
