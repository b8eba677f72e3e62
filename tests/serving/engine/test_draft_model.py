"""The draft model on its own (no ranks): its drafts are its greedy continuation, its cache
trimmed back after a rejection proposes what a fresh one would, and a model of another
vocabulary is refused at load naming serving.draft_model, what differs and the fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from contract.settings import ModelSettings, RankSettings, ServingSettings
from serving.engine.draft_model import DraftMismatch, DraftModel, load_draft
from serving.model.loading import LoadedModel
from testkit import mlx_lm_reference
from testkit.tiny_model import write_tiny_model

# They start no rank; the bundled model's load takes seconds, so those leave the fast lane
# (e2e); the tiny model's check stays in it.
SLOW = pytest.mark.e2e

PROMPT = "Repeat exactly:\ndef add(a, b):\n    return a + b\n"


@SLOW
def test_drafts_are_the_draft_models_greedy_continuation(bundled_model_dir: Path) -> None:
    model, tokenizer = mlx_lm_reference.load(bundled_model_dir)
    prompt = mlx_lm_reference.chat_prompt(tokenizer, PROMPT)
    plain = mlx_lm_reference.greedy(model, tokenizer, prompt, 8).tokens
    draft = DraftModel(model, len(tokenizer.vocab))
    assert draft.propose(prompt, 4) == plain[:4]
    # The target kept 2 drafts and chose its own third token (a rejection): the cache is
    # cut back to what the target kept, and proposes as a fresh cache would.
    kept = [*prompt, *plain[:2], 17]
    fresh = DraftModel(model, len(tokenizer.vocab))
    assert draft.propose(kept, 3) == fresh.propose(kept, 3)
    # Accepted all: the next proposal continues the text.
    assert draft.propose([*prompt, *plain[:5]], 3) == plain[5:8]
    draft.reset()
    assert draft.propose(prompt, 0) == []


@SLOW
def test_a_draft_model_of_another_vocabulary_is_refused(
    tmp_path: Path, bundled_model_dir: Path
) -> None:
    model, tokenizer = mlx_lm_reference.load(bundled_model_dir)
    target = LoadedModel(model, tokenizer, 2048, len(tokenizer.vocab), bundled_model_dir)
    other = write_tiny_model(tmp_path / "tiny", vocab_size=1000)
    settings = RankSettings(
        model=ModelSettings(path=str(bundled_model_dir)),
        serving=ServingSettings(speculative="draft", draft_model=str(other)),
    )
    with pytest.raises(DraftMismatch) as caught:
        load_draft(settings, target)
    message = str(caught.value)
    assert "serving.draft_model" in message and str(other) in message
    assert "1000 rows for" in message and "same tokenizer" in message
    # The same tokenizer and a full embedding: taken.
    same = write_tiny_model(tmp_path / "same")
    settings.serving.draft_model = str(same)
    assert load_draft(settings, target).propose([1, 2, 3], 2)


def test_the_draft_cache_goes_when_a_step_does_not_speculate(tiny_model_dir: Path) -> None:
    """A second request joining (or the sequence ending) drops the draft's cache; the
    next speculating step starts it again from the sequence's tokens."""
    from mlx_lm import load

    from serving.engine.speculative import Speculator
    from serving.engine.step_plan import SamplingParams
    from serving.metrics import ServingMetrics

    model, tokenizer = load(str(tiny_model_dir))[:2]
    draft = DraftModel(model, len(tokenizer.vocab))
    first = draft.propose([1, 2, 3, 4], 3)
    assert draft._cache is not None
    speculator = Speculator(3, ServingMetrics(), draft)
    greedy = SamplingParams(temperature=0.0, top_p=1.0, top_k=0, max_tokens=16, seed=1)
    assert speculator.slots_for([greedy], changes_batch=False) == 3
    assert draft._cache is not None
    assert speculator.slots_for([greedy, greedy], changes_batch=False) == 0
    assert draft._cache is None and draft._fed == []
    assert draft.propose([1, 2, 3, 4], 3) == first
