"""Prompt lookup: draft tokens from the text so far, without a second model.

The last few tokens (an n-gram) are looked for earlier in the prompt and the generated
text; what followed their latest earlier occurrence is the draft. Strong wherever the
answer repeats its input: code edits, summaries, quotes; proposes nothing otherwise.
"""

from __future__ import annotations

import numpy as np

MAX_NGRAM = 3  # longest suffix matched first: a longer match predicts better
MIN_NGRAM = 1
SEARCH_WINDOW = 8192  # tokens searched back from the end: bounds the cost per step


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
