"""Every serving feature at 2 pipeline ranks (each a range of layers), on one shared
cluster per model: the bundled SmolLM2 (prefill chunks of 16 tokens, so every prompt is
chunked) checked against plain, unsplit, unchunked mlx-lm in this process; a tiny model
forced to call a tool, then desynchronised at a worker."""

from __future__ import annotations

import functools
import json
import math
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from contract.exit_codes import RankExit
from contract.metric_names import REQUESTS_RUNNING
from contract.rank_env import FAULT, FORCED_OUTPUT
from testkit import mlx_lm_reference, paths
from testkit.rank_cluster import REPO, RankCluster, rank_cluster
from testkit.serving_requests import LOGPROB_TOL, complete, while_streaming
from testkit.tiny_model import write_tiny_model
from testkit.waiting import metric_value, wait_until

pytestmark = pytest.mark.e2e

SPLIT = [15, 15]  # rank 0 the last 15 of SmolLM2's 30 layers, rank 1 the first 15
CHUNK = 16  # prefill_step_size: every prompt here is longer
LONG = " ".join(
    f"Note {i}: the harbour opens at {i % 12 + 1} o'clock and the ferry to island {i} "
    "leaves when the tide turns." for i in range(7)
) + " Summarise the notes in one sentence."
PENALISED = "List the word sea ten times, separated by commas."
PENALTIES = {"repetition_penalty": 1.3, "presence_penalty": 0.5, "frequency_penalty": 0.5}
TOOL_CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}
TOOL_TEMPLATE = paths.FIXTURES / "tool_calls" / "qwen_tools_template.jinja"
DESYNC_STEP = 60  # after the tool call's steps (about 30), so that test runs first
# Tokens answered: the long prompt's logprobs after its chunked prefill, and the penalised
# answer, which parts from plain greedy within its first words ("sea" is in the prompt).
LONG_TOKENS = 8
PENALISED_TOKENS = 6
# The joiners' answers (a step of SmolLM2 at 2 pipeline ranks here: ~0.3 s, ~0.5 s of
# CPU), and the stream they join: while_streaming checks it outlasts them. 8 tokens each
# are 8 batched steps that must agree with the answers alone.
JOINER_TOKENS = 8
JOINED_TOKENS = 24
CACHED_TOKENS = 3  # the prefix cache test's answers: the prompt is what is reused


@pytest.fixture(scope="module")
def pipeline(
    tmp_path_factory: pytest.TempPathFactory, bundled_model_dir: Path
) -> Iterator[RankCluster]:
    """SmolLM2 at 2 pipeline ranks; no rank may desync or exit while the tests run."""
    with rank_cluster(tmp_path_factory.mktemp("pipeline"), bundled_model_dir, 2,
                      served_model_id="m", pipeline_split=SPLIT,
                      prefill_step_size=CHUNK) as cluster:
        for rank, layers in enumerate(["[15, 30) 0/2", "[0, 15) 1/2"]):
            assert f"pipeline stage with layers {layers}" in cluster.log_text(rank)
        yield cluster
        for rank in range(2):
            assert "DESYNC" not in cluster.log_text(rank)
        assert [proc.poll() for proc in cluster.procs] == [None, None]


@pytest.fixture(scope="module")
def reference(bundled_model_dir: Path) -> dict[str, mlx_lm_reference.Reference]:
    """Plain mlx-lm, the whole model, prompts prefilled in one pass: in a child process,
    which loads OpenBLAS before MLX as ranks do (this one imported MLX already, and MLX's
    own BLAS takes ~40 s for the long prompt)."""
    script = f"""
import json, sys
from dataclasses import asdict
from serving.blas import load_openblas
load_openblas()
from mlx_lm.sample_utils import make_logits_processors
from testkit import mlx_lm_reference as ref
model, tokenizer = ref.load({str(bundled_model_dir)!r})
assert len(ref.chat_prompt(tokenizer, {LONG!r})) > {10 * CHUNK}
def run(content, tokens, processors=None):
    prompt = ref.chat_prompt(tokenizer, content)
    assert len(prompt) > {CHUNK}, len(prompt)
    return asdict(ref.greedy(model, tokenizer, prompt, tokens, logits_processors=processors))
json.dump({{"long": run({LONG!r}, {LONG_TOKENS}),
           "penalised": run({PENALISED!r}, {PENALISED_TOKENS},
                            make_logits_processors(**{PENALTIES!r}))}},
          sys.stdout)
"""
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True,
                          text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return {name: mlx_lm_reference.Reference(**fields)
            for name, fields in json.loads(done.stdout).items()}


def chat(url: str, content: str, max_tokens: int, **fields: object) -> dict[str, Any]:
    r = httpx.post(f"{url}/v1/chat/completions", timeout=300, json={
        "model": "m", "max_tokens": max_tokens, "temperature": 0,
        "messages": [{"role": "user", "content": content}], **fields})
    assert r.status_code == 200, r.text
    return dict(r.json())


def test_chunked_prefill_greedy_and_logprobs_equal_unsplit_mlx_lm(
    pipeline: RankCluster, reference: dict[str, mlx_lm_reference.Reference]
) -> None:
    """A prompt of over 10 prefill chunks gives unchunked 1-rank mlx-lm's tokens, and its
    logprobs within LOGPROB_TOL."""
    body = chat(pipeline.base_url, LONG, LONG_TOKENS, logprobs=True)
    want = reference["long"]
    assert body["choices"][0]["message"]["content"] == want.text
    got = [item["logprob"] for item in body["choices"][0]["logprobs"]["content"]]
    assert len(got) == len(want.logprobs)
    assert all(math.isclose(a, b, abs_tol=LOGPROB_TOL)
               for a, b in zip(got, want.logprobs, strict=True)), (got, want.logprobs)


def test_penalties_equal_unsplit_mlx_lm(
    pipeline: RankCluster, reference: dict[str, mlx_lm_reference.Reference]
) -> None:
    """Repetition, presence and frequency penalties, greedy: mlx-lm's own processors on
    the unsplit model choose the same tokens, which differ from unpenalised greedy."""
    penalised = chat(pipeline.base_url, PENALISED, PENALISED_TOKENS, **PENALTIES)
    plain = chat(pipeline.base_url, PENALISED, PENALISED_TOKENS)
    assert penalised["choices"][0]["message"]["content"] == reference["penalised"].text
    assert penalised["choices"][0]["message"]["content"] != \
        plain["choices"][0]["message"]["content"]


def test_prefix_cache_hit_gives_cached_tokens_and_the_same_output(pipeline: RankCluster) -> None:
    """The same prompt again is served from both stages' prefix caches, with the same text."""
    url = pipeline.base_url
    first = chat(url, "Write a haiku about the sea.", CACHED_TOKENS)
    hits = metric_value(url, "serving_prefix_cache_hit_tokens_total")
    again = chat(url, "Write a haiku about the sea.", CACHED_TOKENS)
    assert metric_value(url, "serving_prefix_cache_hit_tokens_total") - hits >= 20
    assert again["choices"][0]["message"] == first["choices"][0]["message"]


def test_requests_join_a_busy_batch_and_get_their_alone_output(pipeline: RankCluster) -> None:
    """Greedy requests that join while a stream decodes get the text they get alone; the
    stream ends normally, after them."""
    url = pipeline.base_url
    prompts = ["The sea", "A cat"]
    alone = {p: complete(url, p, max_tokens=JOINER_TOKENS) for p in prompts}
    together: dict[str, str] = {}
    # EOS banned: "Long" in a batch of 3 could otherwise reach it early (float32 sums in
    # another batch shape can tip a greedy choice) and end before the joiners.
    body = {"model": "m", "prompt": "Long", "max_tokens": JOINED_TOKENS, "stream": True,
            "logit_bias": {"0": -100, "2": -100}}
    rest = while_streaming(url, body, [functools.partial(answer_into, together, url, p)
                                       for p in prompts])
    assert together == alone
    assert '"finish_reason":"length"' in rest[-2], rest[-2]
    assert rest[-1] == "data: [DONE]"


def answer_into(answers: dict[str, str], url: str, prompt: str) -> None:
    answers[prompt] = complete(url, prompt, max_tokens=JOINER_TOKENS)


def test_client_leaving_mid_stream_frees_its_slot(pipeline: RankCluster) -> None:
    """A stream of 2000 tokens whose client leaves after 3 chunks is removed from the
    batch at once (running back to 0), on both stages."""
    url = pipeline.base_url
    body = {"model": "m", "prompt": "Gone soon", "max_tokens": 2000, "stream": True}
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=120) as r:
        chunks = (line for line in r.iter_lines() if line.startswith("data: {"))
        for _ in range(3):
            next(chunks)
    wait_until(lambda: metric_value(url, REQUESTS_RUNNING) == 0, 20, "the slot freed")
    assert "(cancelled)" in pipeline.log_text(0)


@pytest.fixture(scope="module")
def tiny_pipeline(
    tmp_path_factory: pytest.TempPathFactory, bundled_quantized_dir: Path
) -> Iterator[RankCluster]:
    """A tiny 2-layer llama with a Qwen-style tool template at 2 pipeline ranks (one
    layer each), forced to answer with TOOL_CALL; rank 1 desyncs at DESYNC_STEP."""
    model = write_tiny_model(tmp_path_factory.mktemp("tiny") / "m")
    config_path = model / "tokenizer_config.json"
    config = json.loads(config_path.read_text(encoding="utf-8"))
    config["chat_template"] = TOOL_TEMPLATE.read_text(encoding="utf-8")
    config_path.write_text(json.dumps(config), encoding="utf-8")
    with rank_cluster(tmp_path_factory.mktemp("tiny-ranks"), model, 2, served_model_id="m",
                      pipeline_split=[1, 1],
                      env={FORCED_OUTPUT: TOOL_CALL, FAULT: f"desync:rank=1:step={DESYNC_STEP}"}
                      ) as cluster:
        yield cluster


def test_tool_call_is_parsed(tiny_pipeline: RankCluster) -> None:
    """The forced output comes back as message.tool_calls, finish_reason tool_calls."""
    r = httpx.post(f"{tiny_pipeline.base_url}/v1/chat/completions", timeout=120, json={
        "model": "m", "max_tokens": 64, "tools": [WEATHER],
        "messages": [{"role": "user", "content": "Weather in Paris?"}]})
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    call = choice["message"]["tool_calls"][0]["function"]
    assert (call["name"], json.loads(call["arguments"])) == ("get_weather", {"city": "Paris"})


def test_desync_at_a_pipeline_worker_stops_the_gang(tiny_pipeline: RankCluster) -> None:
    """Rank 1 perturbs its batch fingerprint at DESYNC_STEP: it logs BATCH DESYNC and exits
    DESYNC; rank 0 exits PEER_LOST."""
    url = tiny_pipeline.base_url
    for _ in range(DESYNC_STEP):
        if tiny_pipeline.procs[1].poll() is not None:
            break
        try:
            httpx.post(f"{url}/v1/completions", timeout=30,
                       json={"model": "m", "prompt": "Hello", "max_tokens": 64})
        except httpx.HTTPError:
            break
    assert tiny_pipeline.wait_exit(1, 60) == RankExit.DESYNC
    assert f"BATCH DESYNC at step {DESYNC_STEP + 1}" in tiny_pipeline.log_text(1)
    assert tiny_pipeline.wait_exit(0, 30) == RankExit.PEER_LOST
