"""Tensor-parallel ranks over the ring backend produce exactly the 1-rank greedy output,
with and without logits processors (penalties, logit bias, min_p)."""

from __future__ import annotations

import threading
from pathlib import Path

import httpx
import pytest

from testkit.rank_cluster import rank_cluster
from testkit.waiting import metric_value

pytestmark = pytest.mark.e2e

PROMPTS = ["What is the capital of France?", "Write a haiku about the sea."]
# Every processor at once, sampled with a seed: every rank must apply them alike (the
# plan carries them) or the next plan's token digest stops the gang with a desync.
PROCESSED = {
    "presence_penalty": 0.5,
    "frequency_penalty": 0.5,
    "repetition_penalty": 1.3,
    "logit_bias": {"42": 5.0, "28": -5.0},
    "min_p": 0.05,
    "temperature": 0.7,
    "seed": 11,
    "logprobs": True,
    "top_logprobs": 2,
}


def chat(url: str, messages: list[dict[str, str]], max_tokens: int, **fields: object) -> str:
    r = httpx.post(
        f"{url}/v1/chat/completions",
        timeout=600,
        json={"model": "m", "messages": messages, "max_tokens": max_tokens, **fields},
    )
    assert r.status_code == 200, r.text
    body = r.json()
    return f"{body['usage']['completion_tokens']}:{body['choices'][0]['message']['content']}"


def greedy_outputs(workdir: Path, model_dir: Path, ranks: int, max_tokens: int) -> list[str]:
    """Greedy chat completions for PROMPTS, a sample through every processor, and a second
    turn that must reuse the first turn's KV from every rank's prefix cache."""
    with rank_cluster(workdir, model_dir, ranks, served_model_id="m") as cluster:
        url = cluster.base_url
        outputs = [
            chat(url, [{"role": "user", "content": p}], max_tokens, temperature=0)
            for p in PROMPTS
        ]
        outputs.append(chat(url, [{"role": "user", "content": PROMPTS[1]}], max_tokens,
                            **PROCESSED))
        reused = metric_value(url, "serving_prefix_cache_hit_tokens_total")
        turns = [{"role": "user", "content": PROMPTS[0]},
                 {"role": "assistant", "content": outputs[0].split(":", 1)[1]},
                 {"role": "user", "content": "And the capital of Italy?"}]
        outputs.append(chat(url, turns, max_tokens, temperature=0))
        assert metric_value(url, "serving_prefix_cache_hit_tokens_total") - reused >= 20
        for rank in range(ranks):
            assert f"tensor shard {rank}/{ranks}" in cluster.log_text(rank)
            assert "DESYNC" not in cluster.log_text(rank)
        assert all(proc.poll() is None for proc in cluster.procs)
        return outputs


def test_three_ranks_match_one_rank_on_bundled_model(
    tmp_path: Path, bundled_quantized_dir: Path
) -> None:
    """SmolLM2 (4-bit, as Macs serve it) at 3 ranks: greedy text and token counts equal the
    1-rank run, and so do a seeded sample through every logits processor and a second turn
    from the prefix cache."""
    single = greedy_outputs(tmp_path / "r1", bundled_quantized_dir, 1, 10)
    assert greedy_outputs(tmp_path / "r3", bundled_quantized_dir, 3, 10) == single


@pytest.mark.parametrize("ranks", [2, 4])
def test_tiny_model_matches_one_rank(tmp_path: Path, tiny_model_dir: Path, ranks: int) -> None:
    """The random tiny Llama at 2 and 4 ranks: greedy output equals the 1-rank run."""
    single = greedy_outputs(tmp_path / "r1", tiny_model_dir, 1, 24)
    assert greedy_outputs(tmp_path / f"r{ranks}", tiny_model_dir, ranks, 24) == single


def complete(base_url: str, prompt: str, temperature: float = 0.0) -> str:
    # Sampled: 8 tokens. Joining a batch changes its size, so OpenBLAS's kernels round the
    # logits differently in the last bits; at temperature 0.9 a draw that lands on such a
    # boundary flips a token (seen once in CI at token ~18 of 24). A seed not carried
    # through would differ from the first token.
    max_tokens = 8 if temperature else 24
    body = {"model": "m", "prompt": prompt, "max_tokens": max_tokens,
            "temperature": temperature, "seed": 7}
    r = httpx.post(f"{base_url}/v1/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    return f"{choice['finish_reason']}:{choice['text']}"


def leave_after_three_chunks(base_url: str) -> None:
    body = {"model": "m", "prompt": "Gone soon", "max_tokens": 200, "stream": True}
    with httpx.stream("POST", f"{base_url}/v1/completions", json=body, timeout=120) as r:
        chunks = (line for line in r.iter_lines() if line.startswith("data: {"))
        for _ in range(3):
            next(chunks)


def test_requests_joining_and_leaving_a_busy_batch_stay_in_step(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    """2 ranks: requests that join while a long stream decodes (their plans go out a step
    ahead), one seeded and sampled, get the text they get alone; a client that leaves
    mid-way is removed; the long stream ends normally and no rank exits (a desync would)."""
    prompts = {"The sea": 0.0, "A cat": 0.0, "Numbers": 0.9}
    with rank_cluster(tmp_path, tiny_model_dir, 2, served_model_id="m") as cluster:
        url = cluster.base_url
        alone = {p: complete(url, p, t) for p, t in prompts.items()}
        together: dict[str, str] = {}
        body = {"model": "m", "prompt": "Long", "max_tokens": 400, "stream": True}
        with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=120) as long_stream:
            lines = long_stream.iter_lines()
            next(line for line in lines if line.startswith("data: {"))  # the batch is busy
            threads = [
                threading.Thread(
                    target=lambda p=p, t=t: together.__setitem__(p, complete(url, p, t))
                )
                for p, t in prompts.items()
            ]
            threads.append(threading.Thread(target=leave_after_three_chunks, args=(url,)))
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(120)
            rest = [line for line in lines if line]
        assert together == alone
        assert '"finish_reason":"length"' in rest[-2] and rest[-1] == "data: [DONE]"
        assert "(cancelled)" in cluster.log_text(0)
        assert [proc.poll() for proc in cluster.procs] == [None, None]
