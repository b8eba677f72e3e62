"""An answer's `timings` (serving/api/timings.py): llama.cpp's milliseconds, per token and
per second, from the engine's seconds."""

from __future__ import annotations

import pytest

from serving.api.timings import timings_of
from serving.engine.requests import Finished


def test_timings_are_milliseconds_and_rates_per_second() -> None:
    """0.25 s of prompt over 10 tokens, 1.5 s of generation over 6: 250 ms (25 ms a token,
    40 tokens/s) and 1500 ms (250 ms a token, 4 tokens/s)."""
    done = Finished("stop", prompt_tokens=10, completion_tokens=6, prompt_s=0.25,
                    generation_s=1.5)
    t = timings_of(done)
    assert (t.prompt_n, t.predicted_n) == (10, 6)
    assert t.prompt_ms == pytest.approx(250.0) and t.predicted_ms == pytest.approx(1500.0)
    assert t.prompt_per_token_ms == pytest.approx(25.0)
    assert t.predicted_per_token_ms == pytest.approx(250.0)
    assert t.prompt_per_second == pytest.approx(40.0)
    assert t.predicted_per_second == pytest.approx(4.0)


def test_no_tokens_or_no_time_give_zero_not_a_division_error() -> None:
    t = timings_of(Finished("length", prompt_tokens=0, completion_tokens=0))
    assert (t.prompt_per_token_ms, t.prompt_per_second, t.predicted_per_second) == (0, 0, 0)
