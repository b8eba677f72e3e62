"""Benchmark: the README's demo as a newcomer meets it on this machine.

For each layout of the bundled model on local ranks (1 rank; 2 pipeline ranks; 3 tensor
ranks, the demo before this benchmark), a real `orchestrator up` on free ports; once
`/health` says ready: the first request a newcomer sends ("What is the capital of
France?", streamed, greedy), its time to first token and to its whole answer, then the
same request again (warm), and a 20-token sampled answer.

    .venv/bin/python bench/demo.py [--layouts 1 2p 3t] [--repeats 3]

Figures go to bench/results/demo-<timestamp>.json and a table is printed.
"""

from __future__ import annotations

import argparse
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

MODEL = "bundled:smollm2-135m-instruct"
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
LAYOUTS = {"1": (1, "auto"), "2p": (2, "pipeline"), "3t": (3, "tensor")}


def streamed(url: str, max_tokens: int, temperature: float) -> tuple[float, float, str]:
    """(seconds to the first content token, to the last, the answer) of one chat request."""
    body = {"model": "smollm2-135m-instruct", "messages": QUESTION, "stream": True,
            "max_tokens": max_tokens, "temperature": temperature, "seed": 1}
    start, first, text = time.perf_counter(), float("nan"), ""
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=600) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            piece = (json.loads(line[6:])["choices"] or [{}])[0].get("delta", {}).get("content")
            if piece and text == "":
                first = time.perf_counter() - start
            text += piece or ""
    return first, time.perf_counter() - start, text


def layout(name: str, repeats: int, workdir: Path) -> dict[str, Any]:
    ranks, parallel = LAYOUTS[name]
    nodes = [{"name": f"rank{i}", "transport": "local", "ip": "127.0.0.1"} for i in range(ranks)]
    (workdir / name).mkdir()
    config = write_cluster(workdir / name, MODEL, nodes, cluster={"parallel": parallel})
    url = f"http://127.0.0.1:{tomllib.loads(config.read_text())['api']['port']}"
    started = time.perf_counter()
    with running(config, url=url):
        ready_s = time.perf_counter() - started
        cold = streamed(url, 24, 0.0)
        warm = [streamed(url, 24, 0.0) for _ in range(repeats)]
        sampled = [streamed(url, 20, 0.7) for _ in range(repeats)]
    return {
        "layout": name, "ready_s": ready_s, "answer": cold[2],
        "first_request_ttft_s": cold[0], "first_request_total_s": cold[1],
        "warm_ttft_s": statistics.median(w[0] for w in warm),
        "warm_total_s": statistics.median(w[1] for w in warm),
        "sampled_20_total_s": statistics.median(s[1] for s in sampled),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layouts", nargs="+", choices=list(LAYOUTS), default=list(LAYOUTS))
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        rows = [layout(name, args.repeats, Path(tmp)) for name in args.layouts]
    print(f"{'layout':8} {'ready s':>8} {'1st TTFT':>9} {'1st total':>10} {'warm TTFT':>10} "
          f"{'warm total':>11} {'20 sampled':>11}")
    for r in rows:
        print(f"{r['layout']:8} {r['ready_s']:8.1f} {r['first_request_ttft_s']:9.2f} "
              f"{r['first_request_total_s']:10.2f} {r['warm_ttft_s']:10.2f} "
              f"{r['warm_total_s']:11.2f} {r['sampled_20_total_s']:11.2f}")
    out = results_path("demo")
    out.write_text(json.dumps(rows, indent=2))
    print(f"figures: {out}")


if __name__ == "__main__":
    main()
