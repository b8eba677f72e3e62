"""[serving] kv_bits end to end: the bundled SmolLM2 served with a quantized KV cache at 1
rank, 3 tensor ranks and 2 pipeline ranks, teacher-forced through a passage of the GPL-3
text (rank_env.FORCED_OUTPUT), its logprobs checked against plain unquantized mlx-lm in
this process: the perplexity within the quality bound, each token's logprob close; and a
prefix cache hit served from quantized entries."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import mlx.core as mx
import pytest

from contract.rank_env import FORCED_OUTPUT
from testkit import mlx_lm_reference
from testkit.kv_quality import forced_perplexity, text_tokens
from testkit.rank_cluster import RankCluster, rank_cluster
from testkit.waiting import metric_value

pytestmark = pytest.mark.e2e

GPL = Path("/usr/share/common-licenses/GPL-3")
TOKENS = 96  # of the text, forced; the prompt is its title line
CHUNK = 32  # prefill_step_size: the prefix cache test's prompt is read in chunks
# Perplexity over 96 tokens, quantized / unquantized, at most (issue 41's targets over a
# long text: +1% at 8 bits, +5% at 4); measured here 4 bits ~+1.5% (1 rank), 8 bits ~+0.1%.
BOUND = {4: 1.05, 8: 1.01}
# A token's logprob may move this much with the cache quantized (8 bits ~0.05, 4 bits
# ~0.5 at worst over this text); a broken cache moves them by several nats.
TOKEN_TOL = {4: 1.5, 8: 0.25}
LAYOUTS = {  # id: (ranks, pipeline split, kv_bits)
    "1-rank-4bit": (1, None, 4),
    "3-tensor-8bit": (3, None, 8),
    "2-pipeline-4bit": (2, [15, 15], 4),
}


@pytest.fixture(scope="module")
def passage(bundled_model_dir: Path) -> tuple[str, str]:
    return text_tokens(bundled_model_dir, GPL.read_text(), TOKENS)


@pytest.fixture(scope="module")
def reference(bundled_model_dir: Path, passage: tuple[str, str]) -> list[float]:
    """Each forced token's negative log-likelihood under plain mlx-lm, unquantized."""
    model, tokenizer = mlx_lm_reference.load(bundled_model_dir)
    prompt = list(tokenizer.encode(passage[0]))
    forced = list(tokenizer.encode(passage[1], add_special_tokens=False))
    logits = model(mx.array([prompt + forced]))[0, len(prompt) - 1 : -1]
    logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    return [-float(logprobs[i, t].item()) for i, t in enumerate(forced)]


@pytest.fixture(scope="module", params=list(LAYOUTS))
def served(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
           bundled_model_dir: Path, passage: tuple[str, str]
           ) -> Iterator[tuple[RankCluster, int]]:
    ranks, split, bits = LAYOUTS[request.param]
    with rank_cluster(tmp_path_factory.mktemp(request.param), bundled_model_dir, ranks,
                      served_model_id="m", pipeline_split=split, kv_bits=bits,
                      prefill_step_size=CHUNK, env={FORCED_OUTPUT: passage[1]}) as cluster:
        assert f"KV cache quantized to {bits} bits" in cluster.log_text(0)
        yield cluster, bits


def _forced(cluster: RankCluster, prompt: str) -> list[float]:
    with httpx.Client(base_url=cluster.base_url, timeout=600) as client:
        return forced_perplexity(client, prompt, TOKENS + 8)


def test_quantized_perplexity_and_logprobs_close_to_unquantized(
    served: tuple[RankCluster, int], passage: tuple[str, str], reference: list[float]
) -> None:
    """Teacher-forced through the text, the quantized cache's perplexity stays within the
    bound and every token's logprob near plain unquantized mlx-lm's."""
    cluster, bits = served
    nll = _forced(cluster, passage[0])
    assert len(nll) == len(reference)
    ratio = math.exp((sum(nll) - sum(reference)) / len(nll))
    worst = max(abs(a - b) for a, b in zip(nll, reference, strict=True))
    assert ratio <= BOUND[bits], f"perplexity x{ratio:.4f} at {bits} bits"
    assert worst <= TOKEN_TOL[bits], f"a token's logprob off by {worst:.3f}"


def test_prefix_cache_hit_with_quantized_entries(
    served: tuple[RankCluster, int], passage: tuple[str, str]
) -> None:
    """A prompt whose prefix was cached (quantized) reuses it and scores the text alike."""
    cluster, _ = served
    if len(cluster.procs) != 1:
        pytest.skip("one layout is enough: the entries are the same class at every rank")
    prompt = passage[0] * 3  # longer than a prefill chunk
    first = _forced(cluster, prompt)
    hits: Any = metric_value(cluster.base_url, "serving_prefix_cache_hit_tokens_total")
    again = _forced(cluster, prompt)
    reused = metric_value(cluster.base_url, "serving_prefix_cache_hit_tokens_total") - hits
    assert reused >= len(prompt) // 8
    assert max(abs(a - b) for a, b in zip(first, again, strict=True)) < 1e-3
