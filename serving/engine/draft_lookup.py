"""Prompt lookup: draft tokens from the text so far, without a second model.

The last few tokens (an n-gram) are looked for earlier in the prompt and the generated
text; what followed their latest earlier occurrence is the draft. Strong wherever the
answer repeats its input: code edits, summaries, quotes; proposes nothing otherwise.

`LookupPolicy` is rank 0's choice of which steps draft at all. A drafting step costs
even when it gains nothing: rank 0 waits for the previous token before it can look it
up (the step loses its overlap with the one before), and k drafts the model rejects
widen the forward pass for nothing (4 rejected drafts: ~1.5x a decode step on the
bundled model on CPU). On open chat a 1-token match is mostly chance ("the", ","), so
drafting every step there ran at 0.90-0.98x of not speculating.
"""

from __future__ import annotations

import numpy as np

MAX_NGRAM = 3  # longest suffix matched first: a longer match predicts better
MIN_NGRAM = 2  # a 1-token match drafts chance continuations: rejected ~85% on chat
SEARCH_WINDOW = 8192  # tokens searched back from the end: bounds the cost per step
RESUME_NGRAM = 4  # a match this long ends a back-off: the text has started copying
MAX_BACKOFF = 8  # plain steps after the most consecutive misses, before trying again


def propose(tokens: list[int], k: int, max_ngram: int = MAX_NGRAM,
            min_ngram: int = MIN_NGRAM) -> list[int]:
    """Up to k tokens that followed the latest earlier occurrence of the longest suffix
    of `tokens` (max_ngram down to min_ngram tokens long); [] when none recurs."""
    if k <= 0:
        return []
    window = tokens[-SEARCH_WINDOW:]
    size = len(window)
    # Where the last token occurred before the end: candidate match ends, latest first.
    ends = np.flatnonzero(np.asarray(window[:-1]) == window[-1])[::-1].tolist()
    for n in range(min(max_ngram, size - 1), min_ngram - 1, -1):
        suffix = window[size - n :]
        for end in ends:
            if end + 1 >= n and window[end + 1 - n : end + 1] == suffix:
                return window[end + 1 : end + 1 + k]
    return []


def recurs(tokens: list[int], n: int) -> bool:
    """Whether the last n tokens occurred before (with a token after them)."""
    return bool(propose(tokens, 1, max_ngram=n, min_ngram=n))


class LookupPolicy:
    """Which steps draft, decided on rank 0 as it plans a step (the plan carries the
    slots; workers only follow). The plan for step s+1 is made while step s is still
    to run, so it sees the tokens up to step s-1 (`known`), not the pending ones.

    - Draft only when the known text ends in a recurring n-gram of MIN_NGRAM tokens:
      copying tends to continue, so the step after likely matches too. Otherwise the
      step is a plain decode step at no extra cost.
    - Back off after drafting steps that kept nothing (or found no match after all):
      1, 2, 4 ... up to MAX_BACKOFF plain steps, reset by any accepted draft; a match of
      RESUME_NGRAM tokens ends a back-off early.
    """

    def __init__(self, k: int) -> None:
        self.k = k
        self._misses = 0  # consecutive drafting steps that kept nothing
        self._backoff = 0  # plain steps still to take

    def slots(self, known: list[int] | None) -> int:
        """The next step's draft slots, from the tokens rank 0 knows (None: no single
        sequence to draft for)."""
        if not known:
            return 0
        if self._backoff:
            self._backoff -= 1
            if not recurs(known, RESUME_NGRAM):
                return 0
            self._backoff = 0
        return self.k if recurs(known, MIN_NGRAM) else 0

    def record(self, accepted: int) -> None:
        """A drafting step's outcome: drafts kept (0 also when it proposed none)."""
        if accepted:
            self._misses = 0
            return
        self._misses += 1
        self._backoff = min(2 ** (self._misses - 1), MAX_BACKOFF)

    def reset(self) -> None:
        """A new sequence (or company): start without a back-off."""
        self._misses = self._backoff = 0
