"""Benchmark: latency where users feel it, ours and mlx_lm.server side by side.

- multi-turn: a 5-turn conversation over a ~1,500-token system prompt; the time to first
  token of each turn, ours vs mlx_lm.server, same model, same ranks (the prefix cache
  should make turns 2-5 cost a fraction of the cold first turn);
- long prompt: 4 streams decode; the inter-token latency p50/p99 of those streams alone,
  then while a 4,000-token prompt is prefilled (ours; chunks of prefill_step_size);
- idle: one request after `--idle-s` of idle vs a warm one, in pairs (ours).

    .venv/bin/python bench/latency.py --ranks 1 3 [--idle-s 60 --idle-pairs 5]

Figures go to bench/results/latency-<timestamp>.json and a summary is printed.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from itertools import pairwise
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.serving import mlx_lm_server  # noqa: E402
from contract.blas import find_openblas  # noqa: E402
from contract.settings import ModelSettings, RankSettings  # noqa: E402
from serving.model.loading import resolve  # noqa: E402
from testkit.load import stream_token_times  # noqa: E402
from testkit.rank_cluster import rank_cluster  # noqa: E402

SYSTEM = " ".join(
    f"Rule {i}: when the user mentions topic number {i}, answer politely, cite the rule, "
    f"and keep the answer short." for i in range(1, 76)
)  # ~1,500 tokens
QUESTIONS = ["What is rule 3 about?", "And rule 17?", "Summarise rule 42.",
             "Which rule mentions topic 60?", "Thank you. Anything else?"]


def first_token_s(url: str, model: str, messages: list[dict[str, str]],
                  max_tokens: int = 24) -> tuple[float, str]:
    """Streamed chat: seconds to the first content token, and the whole answer."""
    body = {"model": model, "messages": messages, "max_tokens": max_tokens,
            "temperature": 0, "stream": True}
    start, first, text = time.perf_counter(), None, ""
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=1800) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if line.startswith("data: {"):
                choices = json.loads(line[6:]).get("choices") or [{}]
                piece = choices[0].get("delta", {}).get("content") or ""
                if piece and first is None:
                    first = time.perf_counter() - start
                text += piece
    return first if first is not None else float("nan"), text


def multi_turn(url: str, model: str) -> list[float]:
    messages = [{"role": "system", "content": SYSTEM}]
    ttfts = []
    for question in QUESTIONS:
        messages.append({"role": "user", "content": question})
        ttft, answer = first_token_s(url, model, messages)
        ttfts.append(ttft)
        messages.append({"role": "assistant", "content": answer})
    return ttfts


def quantiles(gaps: list[float]) -> dict[str, float]:
    ordered = sorted(gaps)
    return {"p50": ordered[len(ordered) // 2], "p99": ordered[int(len(ordered) * 0.99)],
            "n": len(ordered)}


def long_prompt(url: str) -> dict[str, Any]:
    """ITL of 4 streams for 3 s alone, then during a 4,000-token prefill."""
    stop = threading.Event()
    arrivals: list[list[float]] = [[] for _ in range(4)]
    threads = [
        threading.Thread(target=stream_token_times, args=(url, a, stop)) for a in arrivals
    ]
    for thread in threads:
        thread.start()
    while min(len(a) for a in arrivals) < 5:
        time.sleep(0.05)
    alone_from = time.monotonic()
    time.sleep(3)
    sent = time.monotonic()
    body = {"model": "m", "prompt": [(i * 7919) % 40000 + 100 for i in range(4000)],
            "max_tokens": 1}
    httpx.post(f"{url}/v1/completions", json=body, timeout=1800).raise_for_status()
    done = time.monotonic()
    stop.set()
    for thread in threads:
        thread.join(60)

    def gaps(lo: float, hi: float) -> list[float]:
        return [b - a for x in arrivals for a, b in pairwise(x) if lo < b <= hi]

    return {"alone": quantiles(gaps(alone_from, sent)), "during": quantiles(gaps(sent, done)),
            "prefill_s": done - sent}


def idle(url: str, idle_s: float, pairs: int) -> list[dict[str, float]]:
    messages = [{"role": "user", "content": "Name a colour."}]
    out = []
    for _ in range(pairs):
        warm, _ = first_token_s(url, "m", messages, 4)
        time.sleep(idle_s)
        cold, _ = first_token_s(url, "m", messages, 4)
        out.append({"warm_s": warm, "after_idle_s": cold, "ratio": cold / warm})
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    # The model as the ranks will serve it: float32 where they load OpenBLAS.
    settings = RankSettings(model=ModelSettings(path=args.model))
    model_dir = resolve(settings, float32=find_openblas() is not None)
    results: dict[str, Any] = {"model": str(model_dir), "runs": {}}
    for ranks in args.ranks:
        with rank_cluster(args.workdir / f"ours-{ranks}", model_dir, ranks,
                          served_model_id="m") as cluster:
            first_token_s(cluster.base_url, "m", [{"role": "user", "content": "hi"}], 2)
            ours: dict[str, Any] = {"multi_turn": multi_turn(cluster.base_url, "m")}
            print(f"ours {ranks}r multi-turn TTFT: {fmt(ours['multi_turn'])}", flush=True)
            ours["long_prompt"] = long_prompt(cluster.base_url)
            print(f"ours {ranks}r long prompt: {ours['long_prompt']}", flush=True)
            if args.idle_pairs:
                ours["idle"] = idle(cluster.base_url, args.idle_s, args.idle_pairs)
                print(f"ours {ranks}r idle: {ours['idle']}", flush=True)
        with mlx_lm_server(model_dir, ranks, args.workdir / f"mlx_lm-{ranks}") as url:
            first_token_s(url, str(model_dir), [{"role": "user", "content": "hi"}], 2)
            theirs = {"multi_turn": multi_turn(url, str(model_dir))}
            print(f"mlx_lm.server {ranks}r multi-turn TTFT: {fmt(theirs['multi_turn'])}",
                  flush=True)
        results["runs"][str(ranks)] = {"ours": ours, "mlx_lm_server": theirs}
    return results


def fmt(values: list[float]) -> str:
    ratio = statistics.median(values[1:]) / values[0]
    return " ".join(f"{v:.2f}" for v in values) + f" s (turns 2-5 median / turn 1: {ratio:.2f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="bundled:smollm2-135m-instruct")
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 3])
    parser.add_argument("--idle-s", type=float, default=60.0)
    parser.add_argument("--idle-pairs", type=int, default=5)
    parser.add_argument("--workdir", type=Path, default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        args.workdir = args.workdir or Path(tmp)
        results = run(args)
    out = REPO / "bench" / "results" / f"latency-{time.strftime('%Y%m%dT%H%M%S')}.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(results, indent=2), encoding="utf-8")
    print(f"figures: {out}")


if __name__ == "__main__":
    main()
