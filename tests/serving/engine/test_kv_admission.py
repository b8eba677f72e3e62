"""Admission by KV budget on a real rank: long prompts wait their turn under a small budget
(no restart), and a request that cannot fit even alone is refused at once, in each API's
error shape, naming the budget and its need."""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from contract.kv_cache import KvLayout, allocated_tokens, sequence_kv_bytes
from contract.model_config import config_info
from testkit.rank_cluster import RankCluster, rank_cluster

pytestmark = pytest.mark.e2e
PROMPT_TOKENS, MAX_TOKENS = 1000, 16
BUDGET_GB = 0.0011  # two of the sequences below, not three
TOO_MANY = 3000  # max_tokens no sequence can grow to under this budget (context 4096)


@pytest.fixture(scope="module")
def cluster(
    tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path
) -> Iterator[RankCluster]:
    with rank_cluster(tmp_path_factory.mktemp("kv"), tiny_model_dir, 1, served_model_id="m",
                      max_batch_size=8, kv_cache_gb=BUDGET_GB) as running:
        yield running


def fitting(model_dir: Path) -> int:
    """How many of the test's sequences the budget holds, from the model's config (the
    tiny model computes in float32: 4 bytes per element)."""
    config = config_info(json.loads((model_dir / "config.json").read_text()))
    layout = KvLayout(range(config.num_hidden_layers or 0), element_bytes=4)
    one = sequence_kv_bytes(config, layout, allocated_tokens(PROMPT_TOKENS + MAX_TOKENS))
    return int(BUDGET_GB * 1e9) // one


def metric(text: str, name: str) -> float:
    return next(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                if line.startswith(name))


def test_long_prompts_wait_for_kv_room(cluster: RankCluster, tiny_model_dir: Path) -> None:
    """8 long prompts sent together all complete; no step ever ran more sequences than the
    budget holds, pairs did run together, and the rank never restarted."""
    fit = fitting(tiny_model_dir)
    assert fit == 2
    url = cluster.base_url

    def complete(i: int) -> dict[str, object]:
        prompt = [(i * 1009 + j * 7919) % 40000 + 100 for j in range(PROMPT_TOKENS)]
        body = {"model": "m", "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0}
        answer = httpx.post(f"{url}/v1/completions", json=body, timeout=120)
        assert answer.status_code == 200, answer.text
        return answer.json()  # type: ignore[no-any-return]

    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(complete, range(8)))
    assert all(a["usage"]["prompt_tokens"] == PROMPT_TOKENS for a in answers)  # type: ignore[index]
    metrics = httpx.get(f"{url}/metrics", timeout=10).text
    steps = metric(metrics, "serving_batch_size_steps_count")
    assert metric(metrics, 'serving_batch_size_steps_bucket{le="2.0"}') == steps  # never 3+
    assert metric(metrics, 'serving_batch_size_steps_bucket{le="1.0"}') < steps  # 2 ran
    assert metric(metrics, 'serving_kv_cache_budget_bytes{rank="0"}') == BUDGET_GB * 1e9
    assert metric(metrics, 'serving_kv_cache_bytes{rank="0"}') <= BUDGET_GB * 1e9
    assert cluster.procs[0].poll() is None
    assert httpx.get(f"{url}/health", timeout=10).status_code == 200


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/completions", {"prompt": "hello", "max_tokens": TOO_MANY}),
        ("/v1/messages", {"messages": [{"role": "user", "content": "hello"}],
                          "max_tokens": TOO_MANY}),
        ("/v1/responses", {"input": "hello", "max_output_tokens": TOO_MANY}),
    ],
)
def test_a_request_beyond_the_budget_alone_is_refused(
    cluster: RankCluster, path: str, body: dict[str, object]
) -> None:
    """400 at once in the API's own error shape, naming the budget and the request's need."""
    answer = httpx.post(f"{cluster.base_url}{path}", json={"model": "m", **body}, timeout=30)
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    if path == "/v1/messages":
        assert answer.json()["type"] == "error"
        assert error["type"] == "invalid_request_error"
    else:
        assert error["code"] == "kv_budget_exceeded"
    assert f"KV budget of {BUDGET_GB * 1e3:.2f} MB" in error["message"]
    assert f"{TOO_MANY} max_tokens" in error["message"]
