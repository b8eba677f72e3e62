"""The grammar mask (structured outputs) in the real sampler, in process: a random-weight
model constrained by a JSON schema writes JSON valid against it, beside an unconstrained
sequence of the same batch that writes what it writes alone; two ranks' masks fed the same
tokens agree; a grammar that cannot be built ends the sequence with EOS."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema_rs
import mlx.core as mx
import numpy as np
import pytest
from mlx_lm import load

from serving.api.structured import json_grammar
from serving.engine.batch import MirroredBatch
from serving.engine.grammar import GrammarCompiler, GrammarMask
from serving.engine.speculative import Speculator
from serving.engine.step_plan import Insert, SamplingParams

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "ok": {"type": "boolean"},
    },
    "required": ["name", "age", "ok"],
    "additionalProperties": False,
}
MAX_TOKENS = 60


@pytest.fixture(scope="module")
def tiny(tiny_model_dir: Path) -> tuple[Any, Any]:
    """The tiny random Llama (the bundled model's tokenizer) and its tokenizer."""
    model, tokenizer = load(str(tiny_model_dir))[:2]
    return model, tokenizer


def compiler(tokenizer: Any, vocab_size: int) -> GrammarCompiler:
    return GrammarCompiler(tokenizer._tokenizer, vocab_size, list(tokenizer.eos_token_ids))


def run(batch: MirroredBatch, inserts: list[Insert]) -> dict[int, list[int]]:
    """Step the batch until every sequence finished; each uid's tokens (EOS left out)."""
    uids = batch.apply(inserts, [])
    tokens: dict[int, list[int]] = {uid: [] for uid in uids}
    while batch.active:
        for event in batch.step():
            if event.finish_reason != "stop":
                tokens[event.uid].append(event.token)
    return tokens


def params(grammar: str = "", seed: int = 0, temperature: float = 0.0) -> SamplingParams:
    return SamplingParams(temperature, 1.0, 0, MAX_TOKENS, seed, grammar=grammar)


def test_constrained_sequence_is_valid_json_beside_an_unconstrained_one(
    tiny: tuple[Any, Any]
) -> None:
    """Greedy and sampled, a schema-constrained sequence of a random model is JSON valid
    against the schema, while the unconstrained sequence in the same batch keeps the
    tokens it has alone (the mask is per sequence)."""
    model, tokenizer = tiny
    vocab = model.args.vocab_size
    prompt = tokenizer.encode("Give me a person as JSON.")

    def batch() -> MirroredBatch:
        return MirroredBatch(model, set(tokenizer.eos_token_ids), vocab, 4, 512,
                             grammars=compiler(tokenizer, vocab))

    grammar = json_grammar(SCHEMA, strict=True, param="p")
    alone = run(batch(), [Insert("free", prompt, params())])
    together = run(batch(), [
        Insert("free", prompt, params()),
        Insert("json", prompt, params(grammar)),
        Insert("sampled", prompt, params(grammar, seed=7, temperature=1.0)),
    ])
    free, greedy, sampled = together.values()
    assert free == next(iter(alone.values()))
    for tokens in (greedy, sampled):
        answer = json.loads(tokenizer.decode(tokens))
        jsonschema_rs.validate(SCHEMA, answer)
    assert free != greedy


def test_masks_fed_the_same_tokens_agree(tiny: tuple[Any, Any]) -> None:
    """Two ranks' masks (built apart from the same grammar) fed the same sampled tokens
    allow the same tokens at every step; the first call consumes nothing (the context ends
    with the prompt) and the finished grammar allows EOS alone."""
    model, tokenizer = tiny
    vocab = model.args.vocab_size
    grammar = json_grammar({"type": "object", "properties": {"a": {"type": "boolean"}},
                            "required": ["a"], "additionalProperties": False},
                           strict=True, param="p")
    ranks = [compiler(tokenizer, vocab).processor(grammar) for _ in range(2)]
    context = tokenizer.encode("prompt")
    rng = np.random.default_rng(0)
    for _ in range(20):
        logits = mx.array(rng.standard_normal((1, vocab)).astype(np.float32))
        masked = [mask(mx.array(context), logits) for mask in ranks]
        assert np.array_equal(np.array(masked[0]), np.array(masked[1]))
        token = int(mx.argmax(masked[0], axis=-1).item())
        if token in tokenizer.eos_token_ids:
            break
        context.append(token)
    text = tokenizer.decode(context[len(tokenizer.encode("prompt")):])
    assert json.loads(text) in ({"a": True}, {"a": False})
    allowed = ranks[0].allowed(vocab)
    assert np.flatnonzero(allowed).tolist() == sorted(tokenizer.eos_token_ids)


def test_a_sequence_without_a_usable_grammar_ends_at_once() -> None:
    """No matcher (a tokenizer llguidance cannot use): EOS alone is allowed, so the
    sequence ends rather than failing the engine."""
    mask = GrammarMask(None, 10, eos_token_id=3)
    out = mask(mx.array([1, 2]), mx.zeros((1, 10)))
    assert np.isfinite(np.array(out)).nonzero()[1].tolist() == [3]


def test_a_constrained_sequence_never_speculates() -> None:
    """No draft slots for a sequence with a grammar, even alone (its steps are normal
    decode steps); the same request without one gets them."""
    spec = Speculator(4, metrics=None, draft=DraftStub())
    assert spec.slots_for([params("grammar")], changes_batch=False) == 0
    assert spec.slots_for([params()], changes_batch=False) == 4


class DraftStub:
    """A draft model's interface: slots_for only resets it."""

    def propose(self, tokens: list[int], k: int) -> list[int]:
        return []

    def reset(self) -> None:
        pass
