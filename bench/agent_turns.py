"""Benchmark: a coding agent's second turn against its first (the prefix cache).

Replays Claude Code's recorded first request (bench/data/claude_code_request.json: its
system prompt, 12 tools, environment message and prompt, ~13,000 tokens, sent as Claude
Code sent it, streamed, through the gateway) to a real `orchestrator up` of the bundled
model, then its next turn: the same body with the first answer and a new user message
appended, as Claude Code sends a conversation's next turn. For each turn: the time to the
first content event (`content_block_delta`), and the prompt tokens rank 0 computed and
reused (its serving_prompt_tokens_total and serving_prefix_cache_hit_tokens_total).

Each repeat changes the first system block (a counter in front), so its first turn finds
nothing cached. The goal (issue 39): turn 2's time to first token <= 0.3x turn 1's at
1 rank.

    .venv/bin/python bench/agent_turns.py [--ranks 1] [--repeats 2]

Figures go to bench/results/agent_turns-<timestamp>.json and a summary is printed.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import tempfile
import time
import tomllib
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from results_file import results_path  # noqa: E402

from testkit.orchestrator_process import running, write_cluster  # noqa: E402

RECORDED = REPO / "bench" / "data" / "claude_code_request.json"
KEY_ENV, KEY = "AGENT_TURNS_BENCH_KEY", "bench-key"
NEXT_PROMPT = "Thanks. Now reply with one word: goodbye"


def rank0_counters(rank0: str) -> dict[str, float]:
    """The prompt tokens rank 0 has read in all, and of those reused from its cache."""
    text = httpx.get(f"{rank0}/metrics", timeout=10).text
    wanted = ("serving_prompt_tokens_total", "serving_prefix_cache_hit_tokens_total")
    values = {name: 0.0 for name in wanted}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name in values:
            values[name] = float(value)
    return values


def turn(url: str, headers: dict[str, str], body: dict[str, Any]) -> tuple[float, str]:
    """One streamed Messages request: seconds to the first content delta, the answer text."""
    start, first, text = time.perf_counter(), None, ""
    with httpx.stream("POST", f"{url}/v1/messages?beta=true", json=body, headers=headers,
                      timeout=3600) as reply:
        if reply.status_code != 200:
            raise SystemExit(f"{reply.status_code}: {reply.read().decode()[:2000]}")
        for line in reply.iter_lines():
            if not line.startswith("data: {"):
                continue
            event = json.loads(line[6:])
            if event.get("type") == "content_block_delta" and first is None:
                first = time.perf_counter() - start
            text += event.get("delta", {}).get("text", "") if "delta" in event else ""
    return first if first is not None else float("nan"), text


def conversation(recorded: dict[str, Any], model: str, repeat: int) -> dict[str, Any]:
    """Claude Code's first request for this repeat: its own model id, a fresh prefix."""
    body = copy.deepcopy(recorded)
    body["model"] = model
    first = body["system"][0]
    first["text"] = f"[bench run {repeat}] {first['text']}"
    return body


def next_turn(body: dict[str, Any], answer: str) -> dict[str, Any]:
    """The conversation's next request: the same system and tools, the answer, a new ask."""
    after = copy.deepcopy(body)
    after["messages"] += [
        {"role": "assistant", "content": [{"type": "text", "text": answer or "hello"}]},
        {"role": "user", "content": [{"type": "text", "text": NEXT_PROMPT}]},
    ]
    return after


def measure(url: str, rank0: str, headers: dict[str, str], body: dict[str, Any]) -> dict[str, Any]:
    """One request's TTFT and what rank 0 computed and reused for it."""
    before = rank0_counters(rank0)
    ttft, answer = turn(url, headers, body)
    after = rank0_counters(rank0)
    prompt = after["serving_prompt_tokens_total"] - before["serving_prompt_tokens_total"]
    reused = (after["serving_prefix_cache_hit_tokens_total"]
              - before["serving_prefix_cache_hit_tokens_total"])
    return {"ttft_s": ttft, "prompt_tokens": prompt, "reused_tokens": reused, "answer": answer}


def run(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    recorded = json.loads(RECORDED.read_text())
    headers = {**recorded["headers"], "x-api-key": KEY}
    config = write_cluster(
        workdir, args.model, [{"name": f"r{i}"} for i in range(args.ranks)],
        supervisor={"standby_ranks": False},
        model={"context_length": args.context_length},
        api={"api_key_env": KEY_ENV},
        serving={"max_tokens_limit": args.max_tokens, "max_tokens_default": args.max_tokens},
    )
    data = tomllib.loads(config.read_text())
    url = f"http://{data['api']['host']}:{data['api']['port']}"
    rank0 = f"http://127.0.0.1:{data['serving']['rank_api_port']}"
    runs = []
    with running(config, env={KEY_ENV: KEY}, url=url):
        model = httpx.get(f"{url}/v1/models", headers=headers, timeout=30).json()["data"][0]["id"]
        warm = {"model": model, "max_tokens": 2,
                "messages": [{"role": "user", "content": "hi"}]}
        turn(url, headers, {**warm, "stream": True})
        for repeat in range(args.repeats):
            body = conversation(recorded["body"], model, repeat)
            one = measure(url, rank0, headers, body)
            two = measure(url, rank0, headers, next_turn(body, one["answer"]))
            ratio = two["ttft_s"] / one["ttft_s"]
            runs.append({"turn1": one, "turn2": two, "ratio": ratio})
            print(f"repeat {repeat}: turn 1 {one['ttft_s']:.2f} s ({one['prompt_tokens']:.0f} "
                  f"prompt tokens, {one['reused_tokens']:.0f} reused), turn 2 "
                  f"{two['ttft_s']:.2f} s ({two['prompt_tokens']:.0f}, "
                  f"{two['reused_tokens']:.0f} reused): ratio {ratio:.3f}", flush=True)
    return {"ranks": args.ranks, "model": args.model, "context_length": args.context_length,
            "runs": runs, "median_ratio": statistics.median(r["ratio"] for r in runs)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="bundled:smollm2-135m-instruct")
    parser.add_argument("--ranks", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--context-length", type=int, default=32_768)
    parser.add_argument("--max-tokens", type=int, default=16,
                        help="serving.max_tokens_limit: Claude Code asks 32,000, capped to this")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        results = run(args, Path(tmp))
    target = "met" if results["median_ratio"] <= 0.3 else "NOT met"
    print(f"median turn 2 / turn 1 TTFT: {results['median_ratio']:.3f} "
          f"(goal <= 0.3 at 1 rank: {target})")
    out = results_path("agent_turns")
    out.write_text(json.dumps(results, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
