"""Structured outputs in the real sampler: a grammar's token mask as a per-sequence logits
processor, applied alike on every rank.

The plan's insert carries the grammar (SamplingParams.grammar, llguidance's serialized
form: serving/api/structured.py makes it from a JSON schema). Every rank compiles it
against the same tokenizer (~0.6 ms for a small schema) and advances it with the tokens
the sequence samples, which are the same on every rank (the token digest checks it), so
every rank computes the same mask (~35 us a token here) and samples the same token. The
alternative, rank 0 computing the mask and sending it (6 KB a token for SmolLM2's 49k
vocabulary), would need rank 0 to know step s's token before it sends step s+1's plan,
which the pipelined plan (sent ahead of the forward pass) does not allow: docs/serving.md.

A masked sequence is in the continuous batch like any other (mlx-lm's BatchGenerator
runs each sequence's own processors); it never speculates (serving/engine/speculative.py).
"""

from __future__ import annotations

import logging
from typing import Any

import mlx.core as mx
import numpy as np

log = logging.getLogger(__name__)


class GrammarCompiler:
    """One rank's grammar side: llguidance's tokenizer, built from the model's Hugging Face
    tokenizer on the first constrained insert (~1 s, once: most launches never need it),
    and a matcher per constrained sequence."""

    def __init__(self, hf_tokenizer: Any, vocab_size: int, eos_token_ids: list[int]) -> None:
        self._hf = hf_tokenizer
        self.vocab_size = vocab_size
        self.eos_token_ids = sorted(eos_token_ids)
        self._tokenizer: Any = None
        self._unusable: str | None = None  # why this tokenizer cannot drive a grammar

    def _llg_tokenizer(self) -> Any:
        if self._tokenizer is None and self._unusable is None:
            try:
                import llguidance.hf  # lazy: pulls in transformers' tokenizer classes

                self._tokenizer = llguidance.hf.from_tokenizer(
                    self._hf, n_vocab=self.vocab_size, eos_token=self.eos_token_ids)
            except Exception as exc:  # a slow (non-Rust) tokenizer, no llguidance installed
                self._unusable = f"no grammar on this rank: {type(exc).__name__}: {exc}"
                log.error("%s", self._unusable)
        return self._tokenizer

    def processor(self, grammar: str) -> GrammarMask:
        """The mask of one sequence constrained by `grammar`. A grammar that does not
        compile here (the API checked it), or no grammar engine on this rank, ends the
        sequence at once rather than failing the engine."""
        tokenizer = self._llg_tokenizer()
        matcher = None
        if tokenizer is not None:
            from llguidance import LLMatcher  # importable: the tokenizer came from it

            matcher = LLMatcher(tokenizer, grammar, log_level=0)
        if matcher is not None and matcher.is_error():
            log.error("grammar does not compile: %s", matcher.get_error())
        return GrammarMask(matcher, self.vocab_size, self.eos_token_ids[0])


class GrammarMask:
    """mlx-lm logits processor: -inf for every token the grammar does not allow next.

    mlx-lm calls it once per decode step with the sequence's tokens so far: on the first
    call they end with the prompt, later with the token the previous step sampled, which
    the matcher consumes first."""

    def __init__(self, matcher: Any, vocab_size: int, eos_token_id: int) -> None:
        self._matcher = matcher  # None: no grammar could be built, only EOS is allowed
        self._vocab_size = vocab_size
        self._eos = eos_token_id
        self._started = False

    def __call__(self, context: mx.array, logits: mx.array) -> mx.array:
        # Start this step's forward pass now: the mask is computed on the CPU while it runs
        # (reading the previous token waits only for the previous step, as mlx-lm would).
        mx.async_eval(logits)
        if self._started:
            self.consume(int(context[-1].item()))  # type: ignore[arg-type]
        self._started = True
        allowed = mx.array(self.allowed(logits.shape[-1]))
        return mx.where(allowed, logits, mx.array(-mx.inf, dtype=logits.dtype))

    def consume(self, token: int) -> None:
        if self._matcher is not None and not self._matcher.consume_token(token):
            log.error("grammar refused sampled token %d: %s", token, self._matcher.get_error())

    def allowed(self, width: int) -> np.ndarray:
        """A bool per logit: the tokens the grammar allows next (EOS alone once it is done
        or in error, so the sequence ends)."""
        if self._matcher is None or self._matcher.is_error():
            only_eos = np.zeros(width, dtype=np.bool_)
            only_eos[self._eos] = True
            return only_eos
        words = np.frombuffer(self._matcher.compute_bitmask(), dtype=np.uint8)
        bits = np.unpackbits(words, bitorder="little")[:width].astype(np.bool_)
        if bits.size < width:  # logits wider than the grammar's vocabulary: padding ids
            bits = np.concatenate([bits, np.zeros(width - bits.size, dtype=np.bool_)])
        return bits
