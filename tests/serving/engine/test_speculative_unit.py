"""Speculative decoding's pure parts: the n-gram proposer, the greedy accept rule, which
requests speculate, the accepted count a worker checks, the settings (no model)."""

from __future__ import annotations

import textwrap
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from orchestrator.config import ConfigErrors, check_cluster_file
from serving.engine import draft_lookup
from serving.engine.speculative import Speculator, accepted_count, wants_speculation
from serving.engine.step_plan import PlanKind, SamplingParams, StepPlan
from serving.faults import Fault, parse_faults
from serving.metrics import ServingMetrics
from serving.rank.worker import Desync, check_plan

GREEDY = SamplingParams(temperature=0.0, top_p=1.0, top_k=0, max_tokens=16, seed=1)


def test_prompt_lookup_drafts_what_followed_the_latest_match() -> None:
    """The longest recurring suffix wins; its latest earlier occurrence is the one used;
    at most k tokens; nothing when the last token never occurred before."""
    assert draft_lookup.propose([1, 2, 3, 4, 1, 2, 3], 3) == [4, 1, 2]
    assert draft_lookup.propose([1, 2, 3, 4, 1, 2, 3], 1) == [4]
    # Suffix [2, 3] occurs at 1 and 4: the later one's continuation.
    assert draft_lookup.propose([1, 2, 3, 9, 2, 3, 5, 2, 3], 2) == [5, 2]
    # The 3-gram [8, 2, 3] matches earlier than the 2-gram's latest occurrence: it wins.
    assert draft_lookup.propose([8, 2, 3, 7, 6, 2, 3, 5, 8, 2, 3], 1) == [7]
    assert draft_lookup.propose([5, 6, 7], 2) == []
    assert draft_lookup.propose([4], 2) == []
    assert draft_lookup.propose([1, 2, 1, 2], 0) == []
    # A run of one token drafts more of it, as far as the text so far reaches.
    assert draft_lookup.propose([1, 1, 1, 1], 3) == [1]


def test_greedy_accept_rule_keeps_the_drafts_the_model_would_have_chosen() -> None:
    """targets[i] is the model's argmax after the pending token and drafts[:i]."""
    assert accepted_count([5, 6, 7], [5, 6, 7, 8]) == 3
    assert accepted_count([5, 6, 7], [5, 9, 7, 8]) == 1  # a miss ends it, later ones too
    assert accepted_count([5, 6, 7], [4, 6, 7, 8]) == 0
    assert accepted_count([], [4]) == 0


def test_requests_with_logits_processors_do_not_speculate() -> None:
    """Penalties and logit bias see one token at a time: normal steps (documented)."""
    assert wants_speculation(GREEDY)
    fields = {f: getattr(GREEDY, f) for f in GREEDY.__struct_fields__}
    assert wants_speculation(SamplingParams(**{**fields, "temperature": 0.7, "min_p": 0.1}))
    for changed in (
        {"repetition_penalty": 1.2}, {"presence_penalty": 0.5},
        {"frequency_penalty": 0.5}, {"logit_bias": [(3, 1.0)]}, {"forced": [1, 2]},
    ):
        assert not wants_speculation(SamplingParams(**{**fields, **changed})), changed


def test_sampled_accept_rule_keeps_the_distribution() -> None:
    """Drafts proposed with certainty, kept with probability p(draft), the residual
    otherwise: the first token after the pending one is distributed as p itself,
    whichever token is drafted (a likely one, an unlikely one)."""
    import mlx.core as mx
    import numpy as np

    from serving.engine.sampling import SeededSampler
    from serving.engine.speculative import sampled_rule

    p = np.array([0.5, 0.3, 0.15, 0.05])
    logprobs = mx.log(mx.array(np.stack([p, p[::-1]]), dtype=mx.float32))
    fields = {f: getattr(GREEDY, f) for f in GREEDY.__struct_fields__}
    for draft in (0, 3):
        sampler = SeededSampler(SamplingParams(**{**fields, "temperature": 1.0, "seed": 7}), 4)
        counts = np.zeros(4)
        trials = 3000
        for _ in range(trials):
            accepted, token = sampled_rule(sampler, logprobs, [draft])
            counts[draft if accepted else int(token.item())] += 1
        assert np.abs(counts / trials - p).max() < 0.03, (draft, counts / trials)


COPYING = [5, 6, 7, 8, 9, 5, 6, 7]  # ends in a 3-token match: the text repeats itself
CHANCE = [5, 6, 7, 8, 9, 4, 3, 5]  # ends in a 1-token match only


def test_draft_slots_only_for_one_greedy_sequence_on_an_unchanged_batch() -> None:
    spec = Speculator(4, ServingMetrics())
    assert spec.slots_for([GREEDY], changes_batch=False, known=COPYING) == 4
    # An insert or remove this step:
    assert spec.slots_for([GREEDY], changes_batch=True, known=COPYING) == 0
    assert spec.slots_for([GREEDY, GREEDY], changes_batch=False, known=COPYING) == 0
    assert spec.slots_for([], changes_batch=False) == 0
    assert spec.slots_for([GREEDY], changes_batch=False, known=None) == 0  # still prefilling


def test_prompt_lookup_drafts_only_after_a_match_of_two_tokens() -> None:
    """A 1-token match is chance: the step is a plain one (no wait, no wider pass)."""
    assert draft_lookup.propose(CHANCE, 4) == []
    assert draft_lookup.propose(CHANCE, 4, min_ngram=1) == [6, 7, 8, 9]
    policy = draft_lookup.LookupPolicy(4)
    assert policy.slots(CHANCE) == 0
    assert policy.slots(COPYING) == 4
    assert policy.slots([]) == policy.slots(None) == 0


def test_prompt_lookup_backs_off_after_misses_and_resumes() -> None:
    """Drafting steps that keep nothing back off 1, 2, 4 ... up to MAX_BACKOFF plain
    steps; an accepted draft resets it; a RESUME_NGRAM-token match ends it early."""
    policy = draft_lookup.LookupPolicy(4)
    two = [1, 2, 9, 8, 7, 6, 1, 2]  # a 2-token match: enough to draft, not to resume

    def plain_steps() -> int:
        count = 0
        while policy.slots(two) == 0:
            count += 1
        return count

    gaps = []
    for _ in range(6):
        policy.record(0)
        gaps.append(plain_steps())
    assert gaps == [1, 2, 4, 8, 8, 8]
    policy.record(2)  # kept drafts: draft again at once
    assert policy.slots(two) == 4
    policy.record(0)
    policy.record(0)
    long_match = [1, 2, 3, 4, 9, 1, 2, 3, 4]
    assert policy.slots(long_match) == 4  # backing off, but the text is copying again
    policy.record(0)
    policy.reset()  # a new sequence starts fresh
    assert policy.slots(two) == 4


def test_speculator_feeds_the_policy_and_resets_it_on_company() -> None:
    """A miss recorded by prompt lookup steps back; a second request resets the policy;
    a draft model drafts every step (its cache would be rebuilt after each pause)."""
    spec = Speculator(4, ServingMetrics())
    spec._policy.record(0)
    assert spec.slots_for([GREEDY], changes_batch=False, known=COPYING) == 0
    assert spec.slots_for([GREEDY, GREEDY], changes_batch=False, known=COPYING) == 0
    assert spec.slots_for([GREEDY], changes_batch=False, known=COPYING) == 4


def test_worker_checks_rank0s_accepted_count() -> None:
    """The plan names rank 0's accepted drafts for the step its digest covers; a worker
    that accepted another count is a desync, reported before the digest."""
    digests, accepted = {2: 11, 3: 13}, {2: 0, 3: 3}
    plan = StepPlan(PlanKind.STEP, 4, 99, 13, 3, accepted=3)
    check_plan(plan, 4, 99, digests, accepted)
    with pytest.raises(Desync, match="accepted drafts in step 3 rank0=2 local=3"):
        check_plan(StepPlan(PlanKind.STEP, 4, 99, 13, 3, accepted=2), 4, 99, digests, accepted)


def test_acceptance_metrics() -> None:
    metrics = ServingMetrics()
    metrics.draft_tokens.inc(8)
    metrics.accepted_tokens.inc(6)
    text = metrics.registry.get_sample_value("serving_spec_acceptance_rate")
    assert text == 0.75
    assert metrics.registry.get_sample_value("serving_spec_accepted_tokens_total") == 6


def test_misaccept_fault_parses() -> None:
    assert parse_faults("misaccept:rank=1:step=5") == [Fault("misaccept", 1, 5)]


def test_config_refuses_an_unknown_speculative_mode(tmp_path: Path) -> None:
    """cluster.toml names the field and the values that would do."""
    file = tmp_path / "cluster.toml"
    file.write_text(textwrap.dedent("""
        [serving]
        speculative = "medusa"
        num_draft_tokens = 40

        [[nodes]]
        name = "a"
    """))
    with pytest.raises(ConfigErrors) as caught:
        check_cluster_file(file)
    by_path = {issue.path: issue for issue in caught.value.issues}
    assert "'off', 'prompt_lookup', 'draft'" in by_path["serving.speculative"].fix
    assert "serving.num_draft_tokens" in by_path


@pytest.mark.parametrize(("serving", "message"), [
    ('speculative = "draft"', 'is missing (speculative = "draft")'),
    ('speculative = "prompt_lookup"\ndraft_model = "/m"', "speculative is 'prompt_lookup'"),
    ('draft_model = "/m"', "speculative is 'off'"),
    ('speculative = "draft"\ndraft_model = "bundled:nope"', "unknown bundled model"),
    ('speculative = "draft"\ndraft_model = "hf:org/name"', "hf: draft models are not fetched"),
])
def test_config_refuses_a_draft_model_without_draft_mode_and_back(
    tmp_path: Path, serving: str, message: str
) -> None:
    """speculative = "draft" and draft_model go together; bundled names are checked."""
    file = tmp_path / "cluster.toml"
    file.write_text(f'[serving]\n{serving}\n\n[[nodes]]\nname = "a"\n')
    with pytest.raises(ConfigErrors) as caught:
        check_cluster_file(file)
    by_path = {issue.path: issue for issue in caught.value.issues}
    assert message in by_path["serving.draft_model"].message, by_path


def test_config_takes_a_draft_model_in_draft_mode(tmp_path: Path) -> None:
    file = tmp_path / "cluster.toml"
    file.write_text('[serving]\nspeculative = "draft"\n'
                    'draft_model = "bundled:smollm2-135m-instruct"\n\n[[nodes]]\nname = "a"\n')
    spec = check_cluster_file(file)[0]
    assert spec.serving.draft_model == "bundled:smollm2-135m-instruct"


def test_a_model_whose_cache_cannot_trim_back_is_refused() -> None:
    """Sliding-window (rotating) or state-space layer caches: refused, naming the types
    and the fix; plain KV caches pass."""
    from mlx_lm.models.cache import ArraysCache, KVCache, RotatingKVCache

    from serving.engine.speculative import SpeculationUnsupported, check_model

    def model(*caches: object) -> Any:
        return SimpleNamespace(make_cache=lambda: list(caches))

    check_model(model(KVCache(), KVCache()))
    with pytest.raises(SpeculationUnsupported, match=r"ArraysCache, KVCache, RotatingKVCache.*"
                       r"speculative = \"off\""):
        check_model(model(KVCache(), RotatingKVCache(max_size=8), ArraysCache(size=2)))


def test_the_orchestrator_reads_the_counters_back_for_status() -> None:
    """`status` shows drafts accepted / verified from rank 0's /metrics."""
    from prometheus_client import generate_latest

    from orchestrator.status.model import ServingStatus
    from orchestrator.status.view import _serving_line
    from orchestrator.supervision.progress import parse_sample

    metrics = ServingMetrics()
    metrics.draft_tokens.inc(8)
    metrics.accepted_tokens.inc(6)
    sample = parse_sample(generate_latest(metrics.registry).decode())
    assert (sample.draft_tokens, sample.accepted_tokens) == (8, 6)
    status = SimpleNamespace(serving=ServingStatus(draft_tokens_total=8, accepted_tokens_total=6))
    assert "drafts accepted 6/8 (75%)" in _serving_line(status).plain  # type: ignore[arg-type]
    assert "drafts" not in _serving_line(SimpleNamespace(serving=ServingStatus())).plain  # type: ignore[arg-type]


# The request's distribution after its filters and temperature, computed here by hand:
# mlx-lm filters the untempered probabilities (top-p keeps a token while the tokens above
# it hold less than top_p; min-p keeps p >= min_p * max p), then scales by 1/T.
PROBS = [0.4, 0.25, 0.15, 0.1, 0.05, 0.03, 0.02]
FILTERS = {  # name: (the SamplingParams fields, the tokens they keep)
    "top_p": ({"top_p": 0.7}, [0, 1, 2]),
    "top_k": ({"top_k": 4}, [0, 1, 2, 3]),
    "min_p": ({"min_p": 0.1}, [0, 1, 2, 3, 4]),
    "all": ({"top_p": 0.9, "top_k": 5, "min_p": 0.05}, [0, 1, 2, 3]),
}
# chi-square at df <= 4 beyond 33 has p < 1e-6: a fair sampler (fixed seed) stays far below.
CHI2_LIMIT = 33.0


def _target(kept: list[int], temperature: float) -> list[float]:
    weights = [PROBS[i] ** (1 / temperature) if i in kept else 0.0 for i in range(len(PROBS))]
    return [w / sum(weights) for w in weights]


def _chi2(counts: list[int], target: list[float]) -> float:
    n = sum(counts)
    assert all(c == 0 for c, q in zip(counts, target, strict=True) if q == 0), counts
    return sum((c - n * q) ** 2 / (n * q) for c, q in zip(counts, target, strict=True) if q)


@pytest.mark.parametrize("name", list(FILTERS))
def test_sampled_speculation_at_half_temperature_keeps_the_filtered_distribution(
    name: str,
) -> None:
    """T = 0.5 with top-p / top-k / min-p: the first token after the pending one, drafted
    (likely, unlikely, filtered out) and accepted or resampled, is distributed as the
    request's own tempered, filtered distribution, as is plain sampling (chi-square)."""
    import mlx.core as mx

    from serving.engine.sampling import SeededSampler
    from serving.engine.speculative import sampled_rule

    changed, kept = FILTERS[name]
    params = SamplingParams(**{**{f: getattr(GREEDY, f) for f in GREEDY.__struct_fields__},
                               "temperature": 0.5, "seed": 11, **changed})
    logprobs = mx.log(mx.array([PROBS, PROBS[::-1]], dtype=mx.float32))
    target, trials = _target(kept, 0.5), 600
    plain = SeededSampler(params, len(PROBS))
    counts = [0] * len(PROBS)
    for _ in range(trials):
        counts[int(plain(logprobs[:1]).item())] += 1
    assert _chi2(counts, target) < CHI2_LIMIT, ("plain", counts, target)
    for draft in (0, kept[-1], 6):
        sampler = SeededSampler(params, len(PROBS))
        counts = [0] * len(PROBS)
        for _ in range(trials):
            accepted, token = sampled_rule(sampler, logprobs, [draft])
            counts[draft if accepted else int(token.item())] += 1
        assert _chi2(counts, target) < CHI2_LIMIT, (draft, counts, target)


def test_a_rank_refusing_speculation_exits_config_error() -> None:
    """A model speculation cannot serve, or a draft model of another vocabulary: the rank
    exits 10 (config error: a restart cannot help), as docs/configuration.md says."""
    from contract.exit_codes import RankExit
    from serving.engine.draft_model import DraftMismatch
    from serving.engine.speculative import SpeculationUnsupported
    from serving.rank.startup import exit_for

    assert exit_for(SpeculationUnsupported("rotating cache")) == RankExit.CONFIG_ERROR == 10
    assert exit_for(DraftMismatch("vocabulary 49152 vs 32000")) == 10
