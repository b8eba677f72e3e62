"""Requests the serving tests send rank 0 and compare across rank counts and modes: a chat
answer summarised as "<completion tokens>:<text>", a seeded completion, every logits
processor at once, the tolerance between two runs' log probabilities, and requests sent
while a stream keeps the batch busy."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import httpx

from testkit.http_tls import default_tls

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


# Log probabilities of one token may differ in the last bits across rank counts and from
# plain mlx-lm (sums split across ranks, OpenBLAS or not); a wrong one is off by far more.
LOGPROB_TOL = 1e-3


def chat_body(url: str, messages: list[dict[str, str]], max_tokens: int,
              **fields: object) -> dict[str, Any]:
    r = httpx.post(
        f"{url}/v1/chat/completions",
        timeout=600,
        json={"model": "m", "messages": messages, "max_tokens": max_tokens, **fields},
        verify=default_tls(),
    )
    assert r.status_code == 200, r.text
    return dict(r.json())


def summary(body: dict[str, Any]) -> str:
    return f"{body['usage']['completion_tokens']}:{body['choices'][0]['message']['content']}"


def complete(base_url: str, prompt: str, temperature: float = 0.0,
             max_tokens: int | None = None) -> str:
    # Sampled: 8 tokens. Joining a batch changes its size, so OpenBLAS's kernels round the
    # logits differently in the last bits; at temperature 0.9 a draw that lands on such a
    # boundary flips a token (seen once in CI at token ~18 of 24). A seed not carried
    # through would differ from the first token. Greedy: 24 unless told.
    max_tokens = max_tokens or (8 if temperature else 24)
    body = {"model": "m", "prompt": prompt, "max_tokens": max_tokens,
            "temperature": temperature, "seed": 7}
    r = httpx.post(f"{base_url}/v1/completions", json=body, timeout=120, verify=default_tls())
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    return f"{choice['finish_reason']}:{choice['text']}"


def while_streaming(url: str, body: dict[str, Any], jobs: list[Callable[[], None]]) -> list[str]:
    """Streams `body` from /v1/completions; once its first chunk arrives (the batch is
    busy), runs `jobs` in threads. Returns the stream's lines after the first chunk, and
    checks that every job ended before the stream did: the jobs ran beside it the whole
    time, so a stream too short to outlast them fails here instead of testing nothing."""
    ended: list[float] = []

    def timed(job: Callable[[], None]) -> None:
        job()
        ended.append(time.monotonic())

    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=120) as stream:
        lines = stream.iter_lines()
        next(line for line in lines if line.startswith("data: {"))
        threads = [threading.Thread(target=timed, args=(job,)) for job in jobs]
        for thread in threads:
            thread.start()
        rest = [line for line in lines if line]  # read as it arrives: the last at its end
        last = time.monotonic()
        for thread in threads:
            thread.join(120)
    assert len(ended) == len(jobs), f"{len(jobs) - len(ended)} job(s) failed or hung"
    assert max(ended) < last, f"the stream ended {max(ended) - last:.2f} s before its jobs"
    return rest
