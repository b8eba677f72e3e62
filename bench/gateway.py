"""Benchmark: what the gateway (`/v1/*` proxied to rank 0) adds over rank 0's own API.

    .venv/bin/python bench/gateway.py [--model bundled:smollm2-135m-instruct|PATH|tiny]
                                      [--ranks 1 3] [--pairs 40] [--repeats 3]
                                      [--stacks installed plain]

Per rank count it starts a real `orchestrator up` (N local ranks, serving settings at the
product defaults but max_batch_size >= 8) and sends the same requests to rank 0 directly
(`http://127.0.0.1:{serving.rank_api_port}`) and through the gateway
(`http://{api.host}:{api.port}`), each path over its own pooled keep-alive httpx.Client:

- TTFT pairs: a streamed chat request (max_tokens 2, temperature 0) once per path, the
  order alternating from pair to pair; TTFT is the arrival of the first `data: {` event
  with content (the first event if none has any). Per pair: gateway - direct. The first
  3 pairs are warm-up. Every request's user message is unique but of the same length (a
  fixed-width serial), so neither path of a pair gets the other's prompt whole from the
  prefix cache. Requests are spaced by the warm-up's longest request: when mlx-lm's
  BatchGenerator hands out a sequence's last token it has already queued the next decode
  step, so a request sent right after another waits for that wasted step (~50 ms at 1
  rank here) on either path. At most 0.8 x keepalive_s, though: idle workers would be
  asleep, and only requests through the gateway wake them;
- plain pairs: a non-streamed `/v1/completions` (max_tokens 1), end to end, alternated
  the same way (the gateway reads a plain response whole before answering);
- models pairs: `GET /v1/models`, `--models-pairs` pairs, alternated, no spacing: no
  engine work behind it, so the difference is the proxy's own cost with little noise;
- aggregate: per round 8 concurrent streamed chats (`--stream-tokens`, 64, distinct prompts), on
  each path in turn (order alternating per round); content chunks / wall time from the
  first start to the last end; the gateway/direct ratio is the median of per-round ratios.

With `--pin` (the default) the orchestrator and this client run on core 0 and the agents
and ranks on the other cores: the proxy's cost when it has a core to itself (as on a Mac),
not how long it waits for rank 0's BLAS threads to leave one of this machine's two.

`--model tiny` serves a random tiny model (1, 2 or 4 ranks): its prefill takes
milliseconds, so TTFT pairs resolve a fraction of a millisecond. Each rank count runs
once per `--stacks` entry: `installed` (the default: uvicorn parses HTTP with httptools
when importable) and `plain` (PYTHONPATH puts modules named uvloop and httptools that
fail to import first: uvicorn's pure-Python h11), the parser's effect side by side.

Targets: the gateway adds <= 1 ms p50 and <= 5 ms p99 to TTFT; aggregate tokens/s at 8
streams through it >= 0.98x direct. Figures go to bench/results/gateway-<timestamp>.json.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import platform
import statistics
import sys
import tempfile
import time
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import psutil
import uvicorn

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from results_file import results_path  # noqa: E402

from contract.settings import ModelSettings, ServingSettings  # noqa: E402
from orchestrator.loadgen.streams import (  # noqa: E402
    chat_body,
    concurrent_streams,
    content_of,
    percentile,
)
from serving.model.bundled import default_cache_dir  # noqa: E402
from testkit.orchestrator_process import rank0_headers, running, write_cluster  # noqa: E402
from testkit.tiny_model import write_tiny_model  # noqa: E402

PATHS = ("direct", "gateway")
WARMUP_PAIRS = 3
MAX_GAP_S = 0.8 * ServingSettings().keepalive_s
STREAMS = 8
MESSAGE = "Request {serial:06d}: answer with one short friendly word."
PLAIN = 500_000  # the plain pairs' serials start here: no prompt shared with the TTFT pairs
STORY = "Story {serial:06d}: write a long tale about a lighthouse keeper and a storm."

Body = dict[str, Any]
Measure = Callable[[httpx.Client, str, Body], float]


def write_bench_cluster(tmp: Path, model: str, ranks: int) -> tuple[Path, dict[str, str]]:
    """N local ranks on free ports, serving at the product defaults (testkit shortens
    keepalive_s for tests); returns (cluster.toml, {"direct": url, "gateway": url})."""
    defaults = ServingSettings()
    nodes = [{"name": f"rank{i}", "transport": "local", "ip": "127.0.0.1"} for i in range(ranks)]
    serving = {"keepalive_s": defaults.keepalive_s,
               "max_batch_size": max(STREAMS, defaults.max_batch_size)}
    path = write_cluster(tmp, model, nodes, cluster={"name": "gateway-bench"}, serving=serving)
    data = tomllib.loads(path.read_text())
    api = data["api"]
    urls = {"direct": f"http://127.0.0.1:{data['serving']['rank_api_port']}",
            "gateway": f"http://{api['host']}:{api['port']}"}
    return path, urls


def pooled_client(headers: dict[str, str]) -> httpx.Client:
    """Keep-alive, like a real client; room for the aggregate's concurrent streams."""
    limits = httpx.Limits(max_connections=2 * STREAMS, max_keepalive_connections=2 * STREAMS)
    return httpx.Client(timeout=httpx.Timeout(600.0), limits=limits, headers=headers)


def completion_body(model: str, text: str) -> Body:
    return {"model": model, "prompt": text, "max_tokens": 1, "temperature": 0}


def stream_ttft(client: httpx.Client, url: str, body: Body) -> float:
    """Seconds to the first event with content (the first event if none has any)."""
    start = time.perf_counter()
    first_event: float | None = None
    first_content: float | None = None
    with client.stream("POST", f"{url}/v1/chat/completions", json=body) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            content = content_of(line)
            if content is None:
                continue
            now = time.perf_counter()
            first_event = first_event if first_event is not None else now
            if content and first_content is None:
                first_content = now
    arrival = first_content if first_content is not None else first_event
    if arrival is None:
        raise RuntimeError(f"no data event from {url}")
    return arrival - start


def plain_latency(client: httpx.Client, url: str, body: Body) -> float:
    """Seconds from sending a non-streamed completion to having its whole body."""
    start = time.perf_counter()
    response = client.post(f"{url}/v1/completions", json=body)
    response.raise_for_status()
    return time.perf_counter() - start


def models_latency(client: httpx.Client, url: str, _: Body) -> float:
    start = time.perf_counter()
    client.get(f"{url}/v1/models").raise_for_status()
    return time.perf_counter() - start


def paired(
    clients: dict[str, httpx.Client], urls: dict[str, str], pairs: int,
    measure: Measure, body_for: Callable[[int], Body], spaced: bool = True,
) -> dict[str, list[float]]:
    """`pairs` pairs of one request per path, the order alternating; seconds per path, the
    first WARMUP_PAIRS left out. Each request gets its own serial (same-length prompts)."""
    seconds: dict[str, list[float]] = {path: [] for path in PATHS}
    serial, gap_s = 0, 0.0
    for pair in range(pairs):
        order = PATHS if pair % 2 == 0 else PATHS[::-1]
        for path in order:
            time.sleep(gap_s)
            started = time.perf_counter()
            taken = measure(clients[path], urls[path], body_for(serial))
            serial += 1
            if pair >= WARMUP_PAIRS:
                seconds[path].append(taken)
            elif spaced:  # below keepalive_s: idle workers would sleep, direct requests wait
                gap_s = min(max(gap_s, time.perf_counter() - started), MAX_GAP_S)
    return seconds


def aggregate_rate(
    client: httpx.Client, url: str, model: str, first_serial: int, tokens: int
) -> float:
    """Content chunks per second of STREAMS concurrent streams of `tokens` tokens, first
    start to last end; their prompts numbered from first_serial."""
    bodies = [chat_body(model, STORY.format(serial=first_serial + i), tokens)
              for i in range(STREAMS)]
    times, wall = concurrent_streams(url, bodies, client=client)
    if failed := [t.error for t in times if t.error]:
        raise RuntimeError(f"{len(failed)} of {STREAMS} streams to {url} failed: {failed[0]}")
    return sum(len(t.arrivals) for t in times) / wall


def aggregate_rounds(
    clients: dict[str, httpx.Client], urls: dict[str, str], model: str, repeats: int,
    tokens: int,
) -> dict[str, list[float]]:
    """Per round, STREAMS concurrent streams on each path in turn, the order alternating."""
    rates: dict[str, list[float]] = {path: [] for path in PATHS}
    serials = iter(range(0, 1_000_000, STREAMS))
    for path in PATHS:  # warm-up: opens each pool's connections
        aggregate_rate(clients[path], urls[path], model, next(serials), tokens)
    for round_ in range(repeats):
        for path in PATHS if round_ % 2 == 0 else PATHS[::-1]:
            rate = aggregate_rate(clients[path], urls[path], model, next(serials), tokens)
            rates[path].append(rate)
            print(f"  8 streams round {round_} {path}: {rates[path][-1]:.1f} tok/s", flush=True)
    return rates


def summary_ms(values: list[float]) -> dict[str, float]:
    ms = [1000 * v for v in values]
    return {"p50": percentile(ms, 0.5), "p99": percentile(ms, 0.99),
            "mean": statistics.fmean(ms), "n": len(ms)}


def pair_diffs(seconds: dict[str, list[float]]) -> list[float]:
    return [g - d for g, d in zip(seconds["gateway"], seconds["direct"], strict=True)]


def pair_figures(seconds: dict[str, list[float]]) -> dict[str, Any]:
    diffs = pair_diffs(seconds)
    return {"diff_ms": summary_ms(diffs),
            "direct_ms": summary_ms(seconds["direct"]),
            "gateway_ms": summary_ms(seconds["gateway"]), "raw_s": {**seconds, "diff": diffs}}


def aggregate_figures(rates: dict[str, list[float]]) -> dict[str, Any]:
    ratios = [g / d for g, d in zip(rates["gateway"], rates["direct"], strict=True)]
    return {"direct_tok_s": statistics.median(rates["direct"]),
            "gateway_tok_s": statistics.median(rates["gateway"]),
            "ratio": statistics.median(ratios), "raw": {**rates, "ratios": ratios}}


def stack_env(stack: str, tmp: Path) -> dict[str, str]:
    """The orchestrator's environment (its ranks inherit it) for one HTTP stack."""
    if stack == "installed":
        return {}
    blocked = tmp / "blocked"
    blocked.mkdir()
    for name in ("uvloop", "httptools"):
        (blocked / f"{name}.py").write_text(f"raise ImportError('{name} off for the bench')\n")
    path = os.environ.get("PYTHONPATH", "")
    return {"PYTHONPATH": f"{blocked}{os.pathsep}{path}" if path else str(blocked)}


def pin_cores(orchestrator_pid: int) -> None:
    """The orchestrator (the gateway) and this client on core 0, the agents and ranks on
    the others: what the proxy costs when it has a core to itself, as on a Mac, not how
    long it waits for rank 0's BLAS threads to leave a core (this machine has two)."""
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        return
    pin_threads(orchestrator_pid, {cores[0]})
    pin_threads(os.getpid(), {cores[0]})
    for child in psutil.Process(orchestrator_pid).children(recursive=True):
        pin_threads(child.pid, set(cores[1:]))


def pin_threads(pid: int, cores: set[int]) -> None:
    """Every thread of pid (sched_setaffinity on a pid moves its main thread only)."""
    for tid in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(ProcessLookupError):
            os.sched_setaffinity(int(tid), cores)


def bench_ranks(args: argparse.Namespace, ranks: int, stack: str) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="gateway-bench-") as tmp:
        path = args.model
        if path == "tiny":  # prefill in milliseconds: TTFT pairs resolve a fraction of a ms
            path = str(write_tiny_model(Path(tmp) / "tiny", model_cache_dir=default_cache_dir()))
        model = ModelSettings(path=path).served_id
        config, urls = write_bench_cluster(Path(tmp), path, ranks)
        with running(config, env=stack_env(stack, Path(tmp)), url=urls["gateway"]) as up:
            if args.pin:
                pin_cores(up.process.pid)
            print(f"{ranks} rank(s), {stack} stack: direct {urls['direct']}, "
                  f"gateway {urls['gateway']}", flush=True)
            # Direct requests carry the launch's secret, as the gateway adds it to its own.
            clients = {path: pooled_client(rank0_headers(config) if path == "direct" else {})
                       for path in PATHS}
            try:
                ttft = paired(clients, urls, args.pairs, stream_ttft, lambda serial:
                              chat_body(model, MESSAGE.format(serial=serial), 2))
                progress("TTFT", ttft)
                plain = paired(clients, urls, args.pairs, plain_latency, lambda serial:
                               completion_body(model, MESSAGE.format(serial=PLAIN + serial)))
                progress("plain", plain)
                listing = paired(clients, urls, args.models_pairs, models_latency, lambda _: {},
                                 spaced=False)
                progress("models", listing)
                rates = aggregate_rounds(clients, urls, model, args.repeats, args.stream_tokens)
            finally:
                for client in clients.values():
                    client.close()
    return {"ranks": ranks, "stack": stack, "ttft": pair_figures(ttft),
            "plain": pair_figures(plain), "models": pair_figures(listing),
            "aggregate": aggregate_figures(rates)}


def progress(name: str, seconds: dict[str, list[float]]) -> None:
    diff = summary_ms(pair_diffs(seconds))
    print(f"  {name} pairs: diff p50 {diff['p50']:+.2f} ms, p99 {diff['p99']:+.2f} ms",
          flush=True)


def print_summary(results: list[dict[str, Any]]) -> None:
    print("\n(ms; diff = gateway - direct per pair; targets: TTFT diff p50 <= 1, p99 <= 5;"
          " 8-stream ratio >= 0.98)")
    for r in results:
        t, p, m, a = r["ttft"], r["plain"], r["models"], r["aggregate"]
        print(f"{r['ranks']} rank(s), {r['stack']} stack, {t['diff_ms']['n']} pairs:")
        print(f"  TTFT  diff p50 {t['diff_ms']['p50']:+.2f} p99 {t['diff_ms']['p99']:+.2f} "
              f"mean {t['diff_ms']['mean']:+.2f} | direct p50/p99 "
              f"{t['direct_ms']['p50']:.1f}/{t['direct_ms']['p99']:.1f} | gateway p50/p99 "
              f"{t['gateway_ms']['p50']:.1f}/{t['gateway_ms']['p99']:.1f}")
        print(f"  plain diff p50 {p['diff_ms']['p50']:+.2f} p99 {p['diff_ms']['p99']:+.2f} "
              f"mean {p['diff_ms']['mean']:+.2f} | direct p50 {p['direct_ms']['p50']:.1f} | "
              f"gateway p50 {p['gateway_ms']['p50']:.1f}")
        print(f"  models diff p50 {m['diff_ms']['p50']:+.2f} p99 {m['diff_ms']['p99']:+.2f} "
              f"mean {m['diff_ms']['mean']:+.2f} | direct p50 {m['direct_ms']['p50']:.2f} | "
              f"gateway p50 {m['gateway_ms']['p50']:.2f}")
        print(f"  {STREAMS} streams: direct {a['direct_tok_s']:.1f} tok/s, gateway "
              f"{a['gateway_tok_s']:.1f} tok/s, ratio {a['ratio']:.3f}")


def meta(args: argparse.Namespace) -> dict[str, Any]:
    return {"model": args.model, "ranks": args.ranks, "stacks": args.stacks, "pin": args.pin,
            "pairs": args.pairs,
            "warmup_pairs": WARMUP_PAIRS, "repeats": args.repeats, "streams": STREAMS,
            "stream_max_tokens": args.stream_tokens, "cpu_count": os.cpu_count(),
            "python": platform.python_version(), "uvicorn": uvicorn.__version__,
            "uvloop": importlib.util.find_spec("uvloop") is not None,
            "httptools": importlib.util.find_spec("httptools") is not None}


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--model", default="bundled:smollm2-135m-instruct",
                        help="bundled:<name>, a model directory, or tiny (a random tiny "
                             "model: 1, 2 or 4 ranks)")
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 3])
    parser.add_argument("--pairs", type=int, default=40)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--models-pairs", type=int, default=300)
    parser.add_argument("--stream-tokens", type=int, default=64,
                        help="max_tokens of each of the 8 concurrent streams")
    parser.add_argument("--pin", action=argparse.BooleanOptionalAction, default=True,
                        help="gateway and client on core 0, ranks on the others")
    parser.add_argument("--stacks", nargs="+", choices=["installed", "plain"],
                        default=["installed"])
    args = parser.parse_args()
    if args.pairs < WARMUP_PAIRS + 2:
        parser.error(f"--pairs must be at least {WARMUP_PAIRS} warm-up pairs + 2")
    results = [bench_ranks(args, ranks, stack) for ranks in args.ranks for stack in args.stacks]
    print_summary(results)
    out = results_path("gateway")
    out.write_text(json.dumps({"meta": meta(args), "results": results}, indent=2))
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
