"""Benchmark: latency where users feel it, ours and mlx_lm.server side by side.

- multi-turn: a 5-turn conversation over a ~1,500-token system prompt; the time to first
  token of each turn, ours vs mlx_lm.server, same model, same ranks (the prefix cache
  should make turns 2-5 cost a fraction of the cold first turn);
- long prompt: 4 streams decode; the inter-token latency p50/p99 of those streams alone,
  then while a 4,000-token prompt is prefilled, for each `--slowdown` (ours; the
  prefill pacer's serving.prefill_max_slowdown, 0 = unpaced chunks of prefill_step_size);
- idle: one request after `--idle-s` of idle vs a warm one, in pairs, for each
  `--keepalive`, through a real `orchestrator up` (its gateway wakes idle workers), with
  the ranks' CPU use while idle.

    .venv/bin/python bench/latency.py --ranks 1 3 [--idle-s 60 --idle-pairs 5]
                                      [--only multi_turn long_prompt idle]

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
import tomllib
from itertools import pairwise
from pathlib import Path
from typing import Any

import httpx
import psutil

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from results_file import results_path  # noqa: E402

from bench.serving import mlx_lm_server  # noqa: E402
from contract.blas import find_openblas  # noqa: E402
from contract.settings import ModelSettings, RankSettings, ServingSettings  # noqa: E402
from serving.model.loading import resolve  # noqa: E402
from testkit.load import stream_token_times  # noqa: E402
from testkit.orchestrator_process import run_cli, running, write_cluster  # noqa: E402
from testkit.rank_cluster import rank_cluster  # noqa: E402

SYSTEM = " ".join(
    f"Rule {i}: when the user mentions topic number {i}, answer politely, cite the rule, "
    f"and keep the answer short." for i in range(1, 76)
)  # ~1,500 tokens
SECTIONS = ("multi_turn", "long_prompt", "idle")
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


def idle(workdir: Path, model_dir: Path, ranks: int, keepalive_s: float,
         args: argparse.Namespace) -> dict[str, Any]:
    """Pairs of (warm TTFT, TTFT after idle_s of idle) through the gateway of a real
    `orchestrator up`, and the ranks' CPU use (cores) while idle."""
    nodes = [{"name": f"r{i}", "ip": "127.0.0.1"} for i in range(ranks)]
    workdir.mkdir(parents=True, exist_ok=True)
    config = write_cluster(workdir, str(model_dir), nodes, serving={"keepalive_s": keepalive_s})
    api = tomllib.loads(config.read_text())["api"]
    url = f"http://{api['host']}:{api['port']}"
    messages = [{"role": "user", "content": "Name a colour."}]
    out, cpu_s = [], 0.0
    with running(config, url=url):
        served = json.loads(run_cli("status", str(config), "--json").stdout)
        procs = [psutil.Process(r["pid"]) for r in served["ranks"]]
        model = served["model"]
        first_token_s(url, model, messages, 4)
        for _ in range(args.idle_pairs):
            warm, _ = first_token_s(url, model, messages, 4)
            before = sum(sum(p.cpu_times()[:2]) for p in procs)
            time.sleep(args.idle_s)
            cpu_s += sum(sum(p.cpu_times()[:2]) for p in procs) - before
            cold, _ = first_token_s(url, model, messages, 4)
            out.append({"warm_s": warm, "after_idle_s": cold, "ratio": cold / warm})
    return {"pairs": out, "idle_cpu_cores": cpu_s / (args.idle_s * args.idle_pairs)}


def run(args: argparse.Namespace) -> dict[str, Any]:
    # The model as the ranks will serve it: float32 where they load OpenBLAS.
    settings = RankSettings(model=ModelSettings(path=args.model))
    model_dir = resolve(settings, float32=find_openblas() is not None)
    results: dict[str, Any] = {"model": str(model_dir), "runs": {}}
    for ranks in args.ranks:
        work = args.workdir / f"{ranks}r"
        ours: dict[str, Any] = {"long_prompt": {}, "idle": {}}
        theirs: dict[str, Any] = {}
        if "multi_turn" in args.only:
            with rank_cluster(work / "ours", model_dir, ranks, served_model_id="m") as cluster:
                first_token_s(cluster.base_url, "m", [{"role": "user", "content": "hi"}], 2)
                ours["multi_turn"] = multi_turn(cluster.base_url, "m")
            print(f"ours {ranks}r multi-turn TTFT: {fmt(ours['multi_turn'])}", flush=True)
        for slowdown in args.slowdown if "long_prompt" in args.only else []:
            with rank_cluster(work / f"paced-{slowdown}", model_dir, ranks,
                              served_model_id="m", prefill_max_slowdown=slowdown) as cluster:
                figures = long_prompt(cluster.base_url)
            ours["long_prompt"][str(slowdown)] = figures
            print(f"ours {ranks}r long prompt, max slowdown {slowdown}: {figures}", flush=True)
        for keepalive in args.keepalive if "idle" in args.only and args.idle_pairs else []:
            figures = idle(work / f"idle-{keepalive}", model_dir, ranks, keepalive, args)
            ours["idle"][str(keepalive)] = figures
            print(f"ours {ranks}r idle, keepalive {keepalive} s: {figures}", flush=True)
        if "multi_turn" in args.only:
            with mlx_lm_server(model_dir, ranks, work / "mlx_lm") as url:
                first_token_s(url, str(model_dir), [{"role": "user", "content": "hi"}], 2)
                theirs["multi_turn"] = multi_turn(url, str(model_dir))
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
    parser.add_argument("--only", nargs="+", choices=SECTIONS, default=list(SECTIONS))
    defaults = ServingSettings()
    parser.add_argument("--slowdown", type=float, nargs="+",
                        default=[defaults.prefill_max_slowdown, 0.0])
    parser.add_argument("--keepalive", type=float, nargs="+", default=[defaults.keepalive_s])
    parser.add_argument("--workdir", type=Path, default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        args.workdir = args.workdir or Path(tmp)
        results = run(args)
    out = results_path("latency")
    out.write_text(json.dumps(results, indent=2), encoding="utf-8")
    print(f"figures: {out}")


if __name__ == "__main__":
    main()
