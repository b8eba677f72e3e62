"""Quality of a served model read back through its API (a test and bench helper): the
teacher-forced negative log-likelihood of a text, and greedy answers with logprobs.

Teacher forcing uses the forced-output test aid (rank_env.FORCED_OUTPUT set to the text
on rank 0): its sampler emits the text's tokens whatever the model prefers, and the
completion's logprobs are the model's own for each of them."""

from __future__ import annotations

from pathlib import Path

import httpx


def text_tokens(model_dir: Path, text: str, tokens: int) -> tuple[str, str]:
    """(prompt, forced text): the text's first line, and about `tokens` tokens of the
    rest (cut at a token boundary of the model's tokenizer)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    title, _, rest = text.strip().partition("\n")
    ids = tokenizer.encode(rest, add_special_tokens=False)[:tokens]
    return title.strip() + "\n", str(tokenizer.decode(ids))


def forced_perplexity(client: httpx.Client, prompt: str, max_tokens: int) -> list[float]:
    """Each forced token's negative log-likelihood, from a completion's logprobs (the
    end-of-sequence token that closes a forced output has none there)."""
    r = client.post("/v1/completions", json={
        "model": "m", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0,
        "logprobs": 0})
    r.raise_for_status()
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "stop", "max_tokens ended the forced text early"
    return [-lp for lp in choice["logprobs"]["token_logprobs"]]


def greedy_tokens(client: httpx.Client, content: str, max_tokens: int
                  ) -> tuple[list[str], list[float]]:
    """A greedy chat answer's tokens and the logprob of each."""
    r = client.post("/v1/chat/completions", json={
        "model": "m", "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens, "temperature": 0.0, "logprobs": True})
    r.raise_for_status()
    items = r.json()["choices"][0]["logprobs"]["content"]
    return [i["token"] for i in items], [i["logprob"] for i in items]
