"""Speculative decoding across ranks: greedy output token for token plain mlx-lm's, with
drafts actually accepted, by prompt lookup at 1 rank and 2 pipeline ranks (SmolLM2) and by
a draft model at 1, 2 pipeline and 3 tensor ranks (a tiny random Llama); a sampled
request speculates too, every rank drawing alike; a worker that accepts another count
than rank 0 exits DESYNC.

Ranks on 2 cores busy-poll each other's collectives (2 per layer per step): a step of
SmolLM2 at 3 tensor ranks takes ~1.5-2 s, of the 2-layer tiny model ~0.1 s. So 3 tensor
ranks speculate on the tiny model, with a draft model (a random model's answer never
copies its prompt, so prompt lookup would draft nothing): workers verify drafts alike
whichever way rank 0 drafted them, as plan contents (serving/engine/draft_model.py). The
tiny model has 6 heads / 3 KV heads (it shards at 3) and an output head scaled up so that
sampling at T = 0.5 mostly follows greedy and keeps drafts; its draft is a slightly
altered copy of itself (what it drafts is known: most tokens, not all)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from contract.exit_codes import RankExit
from serving.model.bundled import default_cache_dir
from testkit import mlx_lm_reference
from testkit.rank_cluster import RankCluster, rank_cluster
from testkit.serving_requests import chat_body, summary
from testkit.tiny_model import write_draft_model, write_tiny_model
from testkit.waiting import metric_value, wait_until

pytestmark = pytest.mark.e2e

# A prompt the answer copies: prompt lookup drafts most of it.
CODE = "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n"
PROMPT = "Repeat exactly:\n" + CODE
MAX_TOKENS = 12  # the answer copies from its 3rd token or so: drafts accepted within 12
SPECULATE = {"speculative": "prompt_lookup", "num_draft_tokens": 4}
# The long answer of the joining test: speculating before the short request joins (after
# a few steps), batched for its ~5, then speculating again for most of its ~64 tokens.
LONG_PROMPT = "Repeat exactly:\n" + CODE * 4
LONG_TOKENS = 64
SPLIT = [20, 10]  # 2 pipeline ranks: SmolLM2's 30 layers


@pytest.fixture(scope="module")
def plain(bundled_model_dir: Path) -> str:
    """Plain mlx-lm's greedy answer, as "<completion tokens>:<text>"."""
    model, tokenizer = mlx_lm_reference.load(bundled_model_dir)
    prompt = mlx_lm_reference.chat_prompt(tokenizer, PROMPT)
    ref = mlx_lm_reference.greedy(model, tokenizer, prompt, MAX_TOKENS)
    return f"{ref.completion_tokens}:{ref.text}"


@pytest.fixture(scope="module")
def pipeline_lookup(
    tmp_path_factory: pytest.TempPathFactory, bundled_model_dir: Path
) -> Iterator[RankCluster]:
    """2 pipeline ranks speculating by prompt lookup, shared by the greedy check and the
    joining one; no rank may desync."""
    with rank_cluster(tmp_path_factory.mktemp("lookup"), bundled_model_dir, 2,
                      served_model_id="m", pipeline_split=SPLIT, **SPECULATE) as cluster:
        yield cluster
        for rank in range(2):
            assert "DESYNC" not in cluster.log_text(rank)


@pytest.mark.parametrize(
    ("ranks", "split"), [(1, None), (2, SPLIT)], ids=["1-rank", "2-pipeline-ranks"],
)
def test_greedy_with_speculation_is_plain_greedy(
    tmp_path: Path, bundled_model_dir: Path, plain: str, ranks: int, split: list[int] | None,
    request: pytest.FixtureRequest,
) -> None:
    """Greedy with prompt lookup is plain mlx-lm's greedy, drafts accepted and counted; a
    sampled request speculates too, the ranks in step."""
    if split:
        check_lookup(request.getfixturevalue("pipeline_lookup"), plain)
        return
    with rank_cluster(tmp_path, bundled_model_dir, ranks, served_model_id="m",
                      **SPECULATE) as cluster:
        check_lookup(cluster, plain)


def check_lookup(cluster: RankCluster, plain: str) -> None:
    url = cluster.base_url
    drafted_before = metric_value(url, "serving_spec_draft_tokens_total")
    accepted_before = metric_value(url, "serving_spec_accepted_tokens_total")
    body = chat_body(url, [{"role": "user", "content": PROMPT}], MAX_TOKENS, temperature=0)
    assert summary(body) == plain
    drafted = metric_value(url, "serving_spec_draft_tokens_total")
    accepted = metric_value(url, "serving_spec_accepted_tokens_total")
    assert 0 < accepted - accepted_before <= drafted - drafted_before, (accepted, drafted)
    assert metric_value(url, "serving_spec_acceptance_rate") == pytest.approx(
        accepted / drafted)
    # Sampled (the accept/reject rule, from the request's key on every rank): the
    # ranks stay in step (a desync would end the gang) and drafts are kept.
    sampled = chat_body(url, [{"role": "user", "content": PROMPT}], MAX_TOKENS,
                        temperature=0.5, seed=3)
    assert sampled["usage"]["completion_tokens"] > 1
    assert metric_value(url, "serving_spec_accepted_tokens_total") > accepted
    for rank in range(cluster.world_size):
        assert "DESYNC" not in cluster.log_text(rank)


def test_a_worker_that_accepts_otherwise_exits_desync(
    tmp_path: Path, tiny_target: Path, tiny_draft: Path
) -> None:
    """Rank 1 miscounts its accepted drafts on every step from 3 (only a step with drafts
    is affected: with a draft model, every step of a request alone); the plan two steps
    later names rank 0's count, and rank 1 exits DESYNC saying which step and both
    counts."""
    faults = ",".join(f"misaccept:rank=1:step={step}" for step in range(3, MAX_TOKENS + 3))
    with rank_cluster(tmp_path, tiny_target, 2, served_model_id="m",
                      env={"ORCHESTRATOR_FAULT": faults}, pipeline_split=[1, 1],
                      **drafting(tiny_draft)) as cluster:
        thread = threading.Thread(target=_ask, args=(cluster.base_url,), daemon=True)
        thread.start()
        assert cluster.wait_exit(1, 120) == RankExit.DESYNC
        log = cluster.log_text(1)
        assert "BATCH DESYNC at step" in log and "accepted drafts in step" in log, log[-2000:]


def _ask(url: str) -> None:
    """The request's outcome is not the point (the gang stops under it)."""
    with contextlib.suppress(httpx.HTTPError):
        httpx.post(f"{url}/v1/chat/completions", timeout=120, json={
            "model": "m", "messages": [{"role": "user", "content": PROMPT}],
            "max_tokens": MAX_TOKENS, "temperature": 0})


def test_a_request_joining_a_speculating_one_stays_in_step(
    pipeline_lookup: RankCluster,
) -> None:
    """2 ranks: a second request joins while the first speculates (steps turn batched),
    leaves, and the first speculates again; the ranks stay in step and both finish."""
    results: dict[str, dict[str, object]] = {}

    def long_one(url: str) -> None:
        results["long"] = chat_body(url, [{"role": "user", "content": LONG_PROMPT}],
                                    LONG_TOKENS, temperature=0)

    cluster = pipeline_lookup
    url = cluster.base_url
    before = metric_value(url, "serving_spec_accepted_tokens_total")
    thread = threading.Thread(target=long_one, args=(url,), daemon=True)
    thread.start()
    wait_until(lambda: metric_value(url, "serving_spec_accepted_tokens_total") > before, 120,
               "the first request to speculate")
    short = chat_body(url, [{"role": "user", "content": "Say hi."}], 4, temperature=0)
    accepted = metric_value(url, "serving_spec_accepted_tokens_total")
    assert thread.is_alive(), results  # the short one came and went during the long one
    thread.join(300)
    assert short["usage"]["completion_tokens"] >= 1  # type: ignore[index]
    assert results["long"]["choices"][0]["finish_reason"] in ("stop", "length")  # type: ignore[index]
    assert metric_value(url, "serving_spec_accepted_tokens_total") > accepted
    for rank in range(2):
        assert "DESYNC" not in cluster.log_text(rank)


@pytest.fixture(scope="module")
def tiny_target(tmp_path_factory: pytest.TempPathFactory, bundled_quantized_dir: Path) -> Path:
    """The tiny Llama with 6 heads / 3 KV heads and a sharpened output head (see above);
    `bundled_quantized_dir`: the tokenizer's source, converted once."""
    return write_tiny_model(tmp_path_factory.mktemp("target") / "m", num_heads=6,
                            num_kv_heads=3, hidden_size=48, head_scale=8.0,
                            model_cache_dir=default_cache_dir())


@pytest.fixture(scope="module")
def tiny_draft(tmp_path_factory: pytest.TempPathFactory, tiny_target: Path) -> Path:
    return write_draft_model(tiny_target, tmp_path_factory.mktemp("draft") / "m")


def drafting(draft: Path) -> dict[str, object]:
    return {"speculative": "draft", "draft_model": str(draft), "num_draft_tokens": 4}


@pytest.fixture(scope="module")
def tiny_plain(tiny_target: Path) -> str:
    """Plain mlx-lm's greedy answer of the tiny model, as "<completion tokens>:<text>"."""
    model, tokenizer = mlx_lm_reference.load(tiny_target)
    prompt = mlx_lm_reference.chat_prompt(tokenizer, PROMPT)
    ref = mlx_lm_reference.greedy(model, tokenizer, prompt, MAX_TOKENS)
    return f"{ref.completion_tokens}:{ref.text}"


@pytest.mark.parametrize(
    ("ranks", "split"), [(1, None), (2, [1, 1]), (3, None)],
    ids=["1-rank", "2-pipeline-ranks", "3-tensor-ranks"])
def test_greedy_with_a_draft_model_is_plain_greedy(
    tmp_path: Path, tiny_target: Path, tiny_draft: Path, tiny_plain: str, ranks: int,
    split: list[int] | None,
) -> None:
    """speculative = "draft": a draft model that agrees with the tiny target on most
    tokens, not all, drafts on rank 0 alone; workers verify as for prompt lookup. Drafts
    are kept and some rejected, and the answer is plain greedy's (a wrong verification
    would take a rejected draft's token); a sampled request speculates too, the ranks in
    step."""
    with rank_cluster(tmp_path, tiny_target, ranks, served_model_id="m",
                      pipeline_split=split, **drafting(tiny_draft)) as cluster:
        url = cluster.base_url
        body = chat_body(url, [{"role": "user", "content": PROMPT}], MAX_TOKENS, temperature=0)
        assert summary(body) == tiny_plain
        accepted = metric_value(url, "serving_spec_accepted_tokens_total")
        drafted = metric_value(url, "serving_spec_draft_tokens_total")
        assert 0 < accepted < drafted, (accepted, drafted)
        assert "draft model" in cluster.log_text(0)
        for rank in range(1, ranks):
            assert "draft model" not in cluster.log_text(rank)
        sampled = chat_body(url, [{"role": "user", "content": PROMPT}], MAX_TOKENS,
                            temperature=0.5, seed=3)
        assert sampled["usage"]["completion_tokens"] > 1
        assert metric_value(url, "serving_spec_accepted_tokens_total") > accepted
        for rank in range(ranks):
            assert "DESYNC" not in cluster.log_text(rank)
