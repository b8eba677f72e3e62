"""Tensor-parallel ranks over the ring backend produce exactly the 1-rank greedy output,
with and without logits processors (penalties, logit bias, min_p), and the 1-rank output
is plain mlx-lm's."""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from contract import rank_env
from testkit import mlx_lm_reference
from testkit.rank_cluster import RankCluster, rank_cluster
from testkit.serving_requests import (
    LOGPROB_TOL,
    PROCESSED,
    chat_body,
    complete,
    summary,
    while_streaming,
)
from testkit.waiting import metric_value

pytestmark = pytest.mark.e2e

PROMPTS = ["What is the capital of France?", "Write a haiku about the sea."]


BIASED = 42  # a +100 logit_bias makes greedy decoding pick it with probability ~1
# Tokens per answer: decode steps over the sharded KV cache after the prefill. Ranks
# beyond the cores busy-poll each other's collectives (2 per layer per step): a step of
# SmolLM2 at 3 ranks on 2 cores takes ~1.5-3 s of wall and ~6 s of CPU, of the tiny model
# at 4 ranks ~0.2 s (its longer answers check a longer KV cache).
BUNDLED_TOKENS = 2
TINY_TOKENS = 6
LONG_TOKENS = 120  # the stream that joining requests share a batch with


def chat(url: str, messages: list[dict[str, str]], max_tokens: int, **fields: object) -> str:
    return summary(chat_body(url, messages, max_tokens, **fields))


def token_logprobs(body: dict[str, Any]) -> list[float]:
    return [item["logprob"] for item in body["choices"][0]["logprobs"]["content"]]


@dataclass
class Served:
    outputs: list[str]  # "<completion tokens>:<text>" of each request
    logprobs: list[list[float]]  # of each greedy PROMPTS answer's tokens


def greedy_outputs(
    workdir: Path, model_dir: Path, ranks: int, max_tokens: int,
    rank_env_extra: Sequence[dict[str, str]] = (), processors: bool = True,
    prompts: Sequence[str] = PROMPTS,
) -> Served:
    """`served_outputs` of a cluster started for them (and stopped after)."""
    with rank_cluster(workdir, model_dir, ranks, served_model_id="m",
                      rank_env_extra=rank_env_extra) as cluster:
        return served_outputs(cluster, max_tokens, processors, prompts)


def served_outputs(
    cluster: RankCluster, max_tokens: int, processors: bool = True,
    prompts: Sequence[str] = PROMPTS,
) -> Served:
    """Greedy chat completions for `prompts` (with their logprobs); with `processors` also a
    sample through every processor, a logit_bias, and a second turn that must reuse the
    first turn's KV from every rank's prefix cache. A +100 logit_bias gives its token a
    logprob of ~0 (taken after the bias)."""
    url, ranks = cluster.base_url, cluster.world_size
    greedy = [
        chat_body(url, [{"role": "user", "content": p}], max_tokens, temperature=0,
                  logprobs=True)
        for p in prompts
    ]
    outputs = [summary(body) for body in greedy]
    if processors:
        outputs.append(processed_and_second_turn(url, outputs[0], max_tokens))
    for rank in range(ranks):
        assert f"tensor shard {rank}/{ranks}" in cluster.log_text(rank)
        assert "DESYNC" not in cluster.log_text(rank)
    # Each rank's prefix cache bound: one value (all_min), whatever each rank computed.
    bounds = {re.findall(r"prefix cache bound ([\d.]+ GB)", cluster.log_text(rank))[0]
              for rank in range(ranks)}
    assert len(bounds) == 1, bounds
    assert all(proc.poll() is None for proc in cluster.procs)
    return Served(outputs, [token_logprobs(body) for body in greedy])


def processed_and_second_turn(url: str, first_answer: str, max_tokens: int) -> str:
    """A sample through every processor, a +100 logit_bias, and a second turn on PROMPTS[0]
    served from the prefix cache: their outputs, joined."""
    processed = chat(url, [{"role": "user", "content": PROMPTS[1]}], max_tokens, **PROCESSED)
    biased = chat_body(url, [{"role": "user", "content": PROMPTS[0]}], 3,
                       temperature=0, logprobs=True, logit_bias={str(BIASED): 100})
    assert biased["usage"]["completion_tokens"] == 3, biased
    assert all(lp > -LOGPROB_TOL for lp in token_logprobs(biased)), biased
    reused = metric_value(url, "serving_prefix_cache_hit_tokens_total")
    turns = [{"role": "user", "content": PROMPTS[0]},
             {"role": "assistant", "content": first_answer.split(":", 1)[1]},
             {"role": "user", "content": "And the capital of Italy?"}]
    second = chat(url, turns, max_tokens, temperature=0)
    assert metric_value(url, "serving_prefix_cache_hit_tokens_total") - reused >= 20
    return f"{processed}|{second}"


def assert_close(got: list[list[float]], want: list[list[float]]) -> None:
    assert [len(g) for g in got] == [len(w) for w in want], (got, want)
    for g, w in zip(got, want, strict=True):
        assert all(math.isclose(a, b, abs_tol=LOGPROB_TOL) for a, b in zip(g, w, strict=True)), (
            g, w)


def assert_plain_mlx_lm(
    model_dir: Path, served: Served, max_tokens: int, prompts: Sequence[str] = PROMPTS
) -> None:
    """The greedy answers to `prompts`, token counts and logprobs are plain mlx-lm's."""
    model, tokenizer = mlx_lm_reference.load(model_dir)
    references = [
        mlx_lm_reference.greedy(
            model, tokenizer, mlx_lm_reference.chat_prompt(tokenizer, p), max_tokens)
        for p in prompts
    ]
    assert served.outputs[: len(prompts)] == [f"{r.completion_tokens}:{r.text}" for r in references]
    assert_close(served.logprobs, [r.logprobs for r in references])


def test_three_ranks_match_plain_mlx_lm_on_bundled_model(
    tmp_path: Path, bundled_quantized_dir: Path
) -> None:
    """SmolLM2 (4-bit, as Macs serve it; 3 KV heads, so 1 or 3 ranks) at 3 ranks: one greedy
    answer's text, token count and logprobs are plain mlx-lm's. (Processors, the prefix
    cache and the ranks' one prefix cache bound are compared at 2 and 4 ranks on the tiny
    model: a step at 3 ranks on 2 cores costs ~2 s.)"""
    three = greedy_outputs(tmp_path, bundled_quantized_dir, 3, BUNDLED_TOKENS,
                           processors=False, prompts=PROMPTS[:1])
    assert_plain_mlx_lm(bundled_quantized_dir, three, BUNDLED_TOKENS, PROMPTS[:1])


@pytest.fixture(scope="module")
def tiny_single(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> Served:
    """The tiny Llama's 1-rank answers, checked against plain mlx-lm: once for every rank
    count compared with them."""
    single = greedy_outputs(tmp_path_factory.mktemp("r1"), tiny_model_dir, 1, TINY_TOKENS)
    assert_plain_mlx_lm(tiny_model_dir, single, TINY_TOKENS)
    return single


def sharing(ranks: int) -> list[dict[str, str]]:
    """Ranks told they share the machine with more ranks than they do size different
    prefix caches on their own; all_min makes them agree (or their evictions, and batches,
    would part): served_outputs checks that every rank logs one bound."""
    return [{rank_env.RANKS_ON_MACHINE: str(ranks + n)} for n in range(ranks)]


@pytest.fixture(scope="module")
def tiny_two(
    tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path
) -> Iterator[RankCluster]:
    """The tiny Llama at 2 ranks sizing their prefix caches apart: shared by the 2-rank
    comparison and the joining test (each checks its own requests only)."""
    with rank_cluster(tmp_path_factory.mktemp("r2"), tiny_model_dir, 2, served_model_id="m",
                      rank_env_extra=sharing(2)) as cluster:
        yield cluster


@pytest.mark.parametrize("ranks", [2, 4])
def test_tiny_model_matches_one_rank(
    tmp_path: Path, tiny_model_dir: Path, tiny_single: Served, ranks: int,
    request: pytest.FixtureRequest,
) -> None:
    """The random tiny Llama at 2 and 4 ranks: greedy output and logprobs equal the 1-rank
    run's, which are plain mlx-lm's, with every processor and from the prefix cache too;
    ranks that size their prefix caches apart agree on one bound."""
    if ranks == 2:
        many = served_outputs(request.getfixturevalue("tiny_two"), TINY_TOKENS)
    else:
        many = greedy_outputs(tmp_path / f"r{ranks}", tiny_model_dir, ranks, TINY_TOKENS,
                              sharing(ranks))
    assert many.outputs == tiny_single.outputs
    assert_close(many.logprobs, tiny_single.logprobs)


def leave_after_three_chunks(base_url: str) -> None:
    body = {"model": "m", "prompt": "Gone soon", "max_tokens": 200, "stream": True}
    with httpx.stream("POST", f"{base_url}/v1/completions", json=body, timeout=120) as r:
        chunks = (line for line in r.iter_lines() if line.startswith("data: {"))
        for _ in range(3):
            next(chunks)


def answer_into(answers: dict[str, str], url: str, prompt: str, temperature: float) -> None:
    answers[prompt] = complete(url, prompt, temperature)


def test_requests_joining_and_leaving_a_busy_batch_stay_in_step(tiny_two: RankCluster) -> None:
    """2 ranks: requests that join while a long stream decodes (their plans go out a step
    ahead), one seeded and sampled, get the text they get alone; a client that leaves
    mid-way is removed; the long stream ends normally, after them, and no rank exits (a
    desync would)."""
    prompts = {"The sea": 0.0, "A cat": 0.0, "Numbers": 0.9}
    cluster = tiny_two
    url = cluster.base_url
    alone = {p: complete(url, p, t) for p, t in prompts.items()}
    together: dict[str, str] = {}
    jobs: list[Callable[[], None]] = [
        functools.partial(answer_into, together, url, p, t) for p, t in prompts.items()
    ]
    jobs.append(functools.partial(leave_after_three_chunks, url))
    # The joiners need ~30 steps (24 tokens at most, batched); while_streaming checks
    # that the long stream outlasted them.
    body = {"model": "m", "prompt": "Long", "max_tokens": LONG_TOKENS, "stream": True}
    rest = while_streaming(url, body, jobs)
    assert together == alone
    assert '"finish_reason":"length"' in rest[-2] and rest[-1] == "data: [DONE]"
    assert "(cancelled)" in cluster.log_text(0)
    assert [proc.poll() for proc in cluster.procs] == [None, None]
