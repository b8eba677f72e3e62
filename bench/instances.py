"""Benchmark: one replica vs two replicas (`[[instances]]`) vs mlx_lm.server, and failover.

    .venv/bin/python bench/instances.py [--levels 1 4 8] [--rounds 3]
                                                   [--tokens 64] [--kills 3]
                                                   [--failover-only] [--burst 4]
                                                   [--kill-after 0.02] [--pinned]

One run, three servers up side by side on the same model (the bundled SmolLM2, float32
with OpenBLAS as the ranks serve it) on this machine:

- `one`: a real `orchestrator up` of one instance on one local node;
- `two`: a real `orchestrator up` of two `[[instances]]` of the same model id (replicas)
  on two local nodes, one rank each, behind one gateway;
- `mlx_lm.server`: `python -m mlx_lm.server` on the same model directory, OpenBLAS
  preloaded with as many threads as this process may use cores (bench/serving.py).

`--pinned` emulates one Mac per node on this box: each node's `python` is ours under
`taskset -c <core>` (node r0 on the first core, r1 on the second), so its agent and its
rank run on that core alone and size their BLAS threads by it (1 thread); mlx_lm.server
runs twice, on the first core alone (`mlx_lm.server-1core`: one Mac, all it can use) and
on the whole box. The gateways (inside each `orchestrator up`) and this load generator
stay unpinned: they would run on some machine too, here sharing both cores with the ranks.
Unpinned (the default), every process may use both cores.

Per level (concurrent streams) and round, each server in turn (the order rotating from
round to round, so a moment's load on this shared machine weighs on all alike) gets
`level` streamed chats at once (greedy, `--tokens` each, distinct prompts of one length);
its rate is generated tokens (the usage each stream reports) / wall time, first send to
last end. Meanwhile the CPU seconds (user + system, every thread, from psutil) of each
server's rank processes, and of our gateway, per generated token. Per level: each
server's median, two / each other server (median of the rounds' ratios). Targets (issue
40) at 8 streams: two / one >= 1.6 and two / mlx_lm.server >= 1.2 (with --pinned judged
against mlx_lm.server-1core: bench/README.md says why).

Failover, on `two` after the rates (`--kills` times, the replica killed alternating):
`--burst` (4) streamed chats are sent at once (least work puts half on each replica), the
rank of one replica is SIGKILLed `--kill-after` (0.02) s later, and as many more are sent
right after the kill (the gateway has not seen it yet, so about half go to the dead
replica: connection refused). With 0.02 s most kills land before the first streams reach
rank 0 on this loaded box (they leave 0.07-0.4 s after); with 0.5 s they are at rank 0, in
prefill, and are lost with it. Per kill: the time from the kill to the last of the
2 x burst streams' first token (every request of the dead replica served by the other),
the same figure for a control burst without a kill, failed requests, when the gateway's
/status showed the replica not ready and when it was ready again. Target: served within
2 s of the kill.

Figures go to bench/results/instances-<pinned|unpinned>-<timestamp>.json, with the BLAS
threads each rank reported and the orchestrators' logs. `--failover-only` starts only
`two` and measures failover (bench/results/instances-failover-<timestamp>.json), keeping
for each kill every stream's sent, first and last token times and the orchestrator's
log lines of the next 30 s, each at its arrival, all in seconds from the kill.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import signal
import statistics
import sys
import tempfile
import threading
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import tomli_w

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from results_file import results_path  # noqa: E402

from bench.instance_rates import STORY, Server, measure_rates, rate_summary  # noqa: E402
from bench.serving import mlx_lm_server  # noqa: E402
from contract.blas import find_openblas  # noqa: E402
from contract.settings import ModelSettings, RankSettings  # noqa: E402
from orchestrator.loadgen.streams import StreamTimes, chat_body, concurrent_streams  # noqa: E402
from serving.model.loading import resolve  # noqa: E402
from testkit.orchestrator_process import (  # noqa: E402
    Orchestrator,
    gateway_status,
    running,
    write_cluster,
)
from testkit.ports import free_port_block  # noqa: E402
from testkit.waiting import wait_until  # noqa: E402

BUNDLED = "bundled:smollm2-135m-instruct"
MODEL_ID = "smollm2"
MLX_PINNED = "mlx_lm.server-1core"  # --pinned: mlx_lm.server on one core (one Mac's share)
FAILOVER_BURST = 4  # streams sent before the kill, and again right after it (--burst)


def pinned_python(tmp: Path, core: int) -> str:
    """A node's `python`: ours under `taskset -c core`, so the node's agent and every rank
    it starts run on that core alone (and size their BLAS threads by it: serving/blas.py)."""
    wrapper = tmp / f"python-core{core}"
    wrapper.write_text(f'#!/bin/sh\nexec taskset -c {core} {shlex.quote(sys.executable)} "$@"\n')
    wrapper.chmod(0o755)
    return str(wrapper)


def write_instances(tmp: Path, name: str, replicas: int, cores: list[int] | None = None,
                    ) -> tuple[Path, str]:
    """`replicas` one-rank instances of the bundled model on local nodes r0.. (node i on
    `cores[i]` alone when given); returns (cluster.toml, the gateway's URL)."""
    tmp.mkdir(parents=True)
    nodes: list[dict[str, Any]] = [{"name": f"r{i}", "transport": "local", "ip": "127.0.0.1"}
                                   for i in range(replicas)]
    for node, core in zip(nodes, cores or [], strict=False):
        node["python"] = pinned_python(tmp, core)
    config = write_cluster(
        tmp, BUNDLED, nodes,
        cluster={"name": name, "rank_port": free_port_block(replicas)},
        serving={"rank_api_port": free_port_block(replicas), "max_batch_size": 8,
                 "keepalive_s": 30.0},
        supervisor={"standby_ranks": False, "backoff_initial_s": 0.2, "max_restarts": 50},
    )
    data = tomllib.loads(config.read_text())
    data["instances"] = [{"name": f"{name}-{i}", "model": BUNDLED, "id": MODEL_ID,
                          "nodes": [f"r{i}"]} for i in range(replicas)]
    config.write_text(tomli_w.dumps(data))
    return config, f"http://{data['api']['host']}:{data['api']['port']}"


def instances(url: str) -> dict[str, dict[str, Any]]:
    return {i["name"]: i for i in gateway_status(url).get("instances", [])}


def all_ready(url: str, count: int) -> bool:
    found = instances(url)
    return len(found) == count and all(i["state"] == "ready" for i in found.values())


@contextlib.contextmanager
def ours(tmp: Path, name: str, replicas: int, cores: list[int] | None = None,
         ) -> Iterator[tuple[str, Orchestrator]]:
    config, url = write_instances(tmp / name, name, replicas, cores)
    with running(config, url=url) as orchestrator:
        wait_until(lambda: all_ready(url, replicas), 600, f"{name}: every instance ready")
        yield url, orchestrator


class StatusWatch:
    """Polls the gateway's /status every 50 ms: when `name` left ready, and came back."""

    def __init__(self, url: str, name: str) -> None:
        self.url, self.name = url, name
        self.left: float | None = None
        self.back: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            state = instances(self.url).get(self.name, {}).get("state")
            now = time.perf_counter()
            if self.left is None and state not in (None, "ready"):
                self.left = now
            elif self.left is not None and self.back is None and state == "ready":
                self.back = now
            self._stop.wait(0.05)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def burst_pair(
    url: str, tokens: int, serials: Iterator[int], victim_pid: int | None,
    args: argparse.Namespace,
) -> tuple[float, list[StreamTimes]]:
    """`--burst` streams, the kill (if any) `--kill-after` s after they start, then as
    many more; returns (the kill's perf_counter time, or the first send's, and every
    stream)."""
    burst = args.burst
    results: list[list[StreamTimes]] = []

    def send() -> None:
        bodies = [chat_body(MODEL_ID, STORY.format(serial=next(serials)), tokens)
                  for _ in range(burst)]
        results.append(concurrent_streams(url, bodies, timeout_s=120)[0])

    first = threading.Thread(target=send)
    first.start()
    time.sleep(args.kill_after)  # sent (or on their way), not yet answered
    t0 = time.perf_counter()
    if victim_pid is not None:
        os.kill(victim_pid, signal.SIGKILL)
    send()
    first.join()
    return t0, [t for burst in results for t in burst]


def served_after(t0: float, times: list[StreamTimes]) -> float | None:
    """Seconds from t0 to the last stream's first token (None: one had none)."""
    firsts = [t.arrivals[0] for t in times if t.arrivals]
    return max(firsts) - t0 if len(firsts) == len(times) else None


def stream_times(t0: float, times: StreamTimes) -> dict[str, float | None]:
    def since(t: float | None) -> float | None:
        return None if t is None else round(t - t0, 3)
    return {"sent_s": since(times.started),
            "first_token_s": since(times.arrivals[0] if times.arrivals else None),
            "last_token_s": since(times.arrivals[-1] if times.arrivals else None)}


def measure_failover(url: str, orchestrator: Orchestrator, args: argparse.Namespace,
                     ) -> list[dict[str, Any]]:
    """Per kill: a control burst pair, then the same with one replica's rank killed."""
    serials = iter(range(2 * 10**6, 3 * 10**6))
    runs = []
    for kill in range(args.kills):
        wait_until(lambda: all_ready(url, 2), 300, "both replicas ready")
        time.sleep(1.0)
        c0, control = burst_pair(url, args.failover_tokens, serials, None, args)
        name = sorted(instances(url))[kill % 2]
        pid = instances(url)[name]["ranks"][0]["pid"]
        watch = StatusWatch(url, name)
        t0, times = burst_pair(url, args.failover_tokens, serials, pid, args)
        wait_until(lambda w=watch: w.back is not None, 300, f"{name} ready again")
        watch.stop()
        run = {
            "killed": name, "served_s": served_after(t0, times),
            "control_served_s": served_after(c0, control),
            "failed": [t.error for t in times if t.error],
            "control_failed": [t.error for t in control if t.error],
            "status_not_ready_s": None if watch.left is None else watch.left - t0,
            "ready_again_s": None if watch.back is None else watch.back - t0,
            # Each stream from the kill: sent, first token, last token (why it was late)
            "streams": [stream_times(t0, t) for t in times],
            "control_streams": [stream_times(c0, t) for t in control],
            # The orchestrator's lines from the kill on, each at its arrival (s from the kill)
            "log_from_kill": [(round(t - t0, 3), line) for t, line in list(orchestrator.lines)
                              if t0 <= t <= t0 + 30],
        }
        runs.append(run)
        print(f"  kill {kill} ({name}): served {run['served_s']} s after the kill "
              f"(control {run['control_served_s']}), failed {len(run['failed'])}, "
              f"not ready after {run['status_not_ready_s']}, back after "
              f"{run['ready_again_s']}", flush=True)
    return runs


def blas_threads(orchestrator: Orchestrator) -> list[str]:
    return [line for line in orchestrator.output if "BLAS:" in line]


def failover_summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    served = [r["served_s"] for r in runs if r["served_s"] is not None]
    control = [r["control_served_s"] for r in runs if r["control_served_s"] is not None]
    return {"served_s_median": statistics.median(served) if served else None,
            "served_s_max": max(served) if served else None,
            "served_s_each": [round(s, 2) for s in served],
            "control_served_s_median": statistics.median(control) if control else None,
            "control_served_s_each": [round(c, 2) for c in control],
            "failed_requests": sum(len(r["failed"]) for r in runs),
            "kills": len(runs)}


def print_summary(rates: dict[str, Any], failover: dict[str, Any] | None) -> None:
    for level, row in rates.items():
        names = list(row["cpu_s_per_token"])
        print(f"\n{level} streams: " + ", ".join(
            f"{n} {row[f'{n}_tok_s']:.1f} tok/s" for n in names))
        print("  two / " + ", two / ".join(
            f"{n} {row[f'two_over_{n}']:.2f}x" for n in names if n != "two"))
        print("  CPU s per token: " + "; ".join(
            f"{n} " + " ".join(f"{role} {s:.4f}" for role, s in by.items())
            for n, by in row["cpu_s_per_token"].items()))
    if rates:
        print("targets at 8 streams: two / one >= 1.6, two / mlx_lm.server >= 1.2")
    if failover:
        print(f"failover: last first token {failover['served_s_median']:.2f} s after the "
              f"kill (median; each {failover['served_s_each']}; control without a kill "
              f"{failover['control_served_s_median']:.2f}, each "
              f"{failover['control_served_s_each']}), {failover['failed_requests']} "
              f"requests failed over {failover['kills']} kills (target <= 2 s)")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--levels", type=int, nargs="+", default=[1, 4, 8])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=64, help="max_tokens per stream")
    parser.add_argument("--kills", type=int, default=3)
    parser.add_argument("--failover-tokens", type=int, default=16)
    parser.add_argument("--burst", type=int, default=FAILOVER_BURST,
                        help="failover: streams sent before the kill, and again after it")
    parser.add_argument("--kill-after", type=float, default=0.02,
                        help="failover: seconds from the first streams' start to the kill "
                             "(0.5: they are at rank 0, in prefill, on this loaded box)")
    parser.add_argument("--failover-only", action="store_true",
                        help="start only `two` and measure failover (no rates)")
    parser.add_argument("--pinned", action="store_true",
                        help="each node on a core of its own (taskset), and mlx_lm.server "
                             "both on one core and on the whole box")
    return parser.parse_args()


def rank_pids(url: str) -> list[int]:
    return [rank["pid"] for i in instances(url).values() for rank in i["ranks"]]


def mlx_pid(url: str) -> int:
    """The mlx_lm.server child of this process that listens on `url`'s port."""
    port = url.rsplit(":", 1)[1]
    return next(p.pid for p in psutil.Process().children(recursive=True)
                if "mlx_lm.server" in p.cmdline() and port in p.cmdline())


def start_servers(stack: contextlib.ExitStack, tmp: Path, model_dir: Path, pinned: bool,
                  ) -> tuple[dict[str, Server], dict[str, Orchestrator]]:
    """`one`, `two` and mlx_lm.server (with --pinned: node i on core i, and mlx_lm.server
    also on core 0 alone), up side by side; the gateways and this load generator stay
    unpinned."""
    cores = sorted(os.sched_getaffinity(0))[:2] if pinned else None
    one_url, one = stack.enter_context(ours(tmp, "inst-one", 1, cores))
    two_url, two = stack.enter_context(ours(tmp, "inst-two", 2, cores))
    servers = {
        "one": Server(one_url, MODEL_ID, {"rank": rank_pids(one_url),
                                          "gateway": [one.process.pid]}),
        "two": Server(two_url, MODEL_ID, {"rank": rank_pids(two_url),
                                          "gateway": [two.process.pid]}),
    }
    mlx_url = stack.enter_context(mlx_lm_server(model_dir, 1, tmp / "mlx"))
    servers["mlx_lm.server"] = Server(mlx_url, str(model_dir), {"rank": [mlx_pid(mlx_url)]})
    if cores:
        url = stack.enter_context(mlx_lm_server(model_dir, 1, tmp / "mlx-1", cores[:1]))
        servers[MLX_PINNED] = Server(url, str(model_dir), {"rank": [mlx_pid(url)]})
    return servers, {"one": one, "two": two}


def main() -> None:
    args = parse_args()
    if args.failover_only:
        failover_only(args)
        return
    model_dir = resolve(RankSettings(model=ModelSettings(path=BUNDLED)),
                        float32=find_openblas() is not None)  # as the ranks serve it
    with tempfile.TemporaryDirectory(prefix="instances-bench-") as tmp, \
            contextlib.ExitStack() as stack:
        servers, orchestrators = start_servers(stack, Path(tmp), model_dir, args.pinned)
        raw, cpu = measure_rates(servers, args)
        rates = rate_summary(raw, cpu)
        two = orchestrators["two"]
        runs = measure_failover(servers["two"].url, two, args) if args.kills else []
        logs = {name: o.output for name, o in orchestrators.items()}
        blas = {name: blas_threads(o) for name, o in orchestrators.items()}
    failover = failover_summary(runs) if runs else None
    print_summary(rates, failover)
    mode = "pinned" if args.pinned else "unpinned"
    out = results_path(f"instances-{mode}")
    meta = {"model_dir": str(model_dir), "blas": find_openblas(), "cpu_count": os.cpu_count(),
            "mode": mode, "load_average": os.getloadavg(), **vars(args)}
    out.write_text(json.dumps({"meta": meta, "rates": rates, "raw_rates": raw,
                               "raw_cpu_s_per_token": cpu, "failover": failover,
                               "failover_runs": runs, "blas_lines": blas, "logs": logs},
                              indent=2))
    print(f"\nwrote {out}")


def failover_only(args: argparse.Namespace) -> None:
    """`--failover-only`: `two` alone, the kills, its log."""
    with tempfile.TemporaryDirectory(prefix="instances-bench-") as tmp, \
            ours(Path(tmp), "inst-two", 2) as (two_url, two):
        runs = measure_failover(two_url, two, args)
        log = two.output
    failover = failover_summary(runs)
    print_summary({}, failover)
    out = results_path("instances-failover")
    out.write_text(json.dumps({"meta": vars(args), "failover": failover,
                               "failover_runs": runs, "logs": {"two": log}}, indent=2))
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
