"""Benchmark: what starting a serving gang costs, by phase (issue 38, the suite's time).

Three parts, each figure the median of `--repeats` runs:

    imports      a fresh `python -c "import M"` per module a process needs: the rank's
                 entry (serving.rank.main), rank 0's and a worker's code, the orchestrator's
                 CLI, the node agent; wall and CPU (user + sys) seconds
    ranks N      testkit.rank_cluster on the tiny model (1 and 2 ranks), from spawn to
                 /health 200, split by the ranks' own log lines (millisecond timestamps):
                 spawn -> `rank R of N` (interpreter, imports, distributed init), -> the
                 last `loaded ... in X s` (model load), -> `all N ranks loaded`, ->
                 `ready` (batch, grammar compiler, engine), -> /health 200 seen (polling)
    up           `orchestrator up` of a local 1-node cluster file on the tiny model, from
                 spawn to the gateway's /health 200, by the arrival time of its output's
                 milestones (agent start, preflight, launch, rank joined / loaded, ready)

Figures go to bench/results/startup-<ts>.json. Heavy (starts ranks): run through the lock.

    .venv/bin/python bench/startup.py [--repeats 3] [--only imports ranks up]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
import tomllib
from datetime import datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from results_file import RESULTS, results_path  # noqa: E402

from serving.model.bundled import default_cache_dir  # noqa: E402
from testkit.orchestrator_process import Orchestrator, write_cluster  # noqa: E402
from testkit.rank_cluster import rank_cluster  # noqa: E402
from testkit.tiny_model import write_tiny_model  # noqa: E402

IMPORTS = (
    "serving.rank.main",
    "serving.rank.worker",
    "serving.rank.rank0",
    "orchestrator.cli",
    "orchestrator.up",
    "node_agent.agent",
)
STAMP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ")
RANK_MILESTONES = {
    "joined": re.compile(r"\brank \d+ of \d+ \(backend"),
    "loaded": re.compile(r"\bloaded .* in [\d.]+ s"),
    "all_loaded": re.compile(r"\ball \d+ ranks loaded"),
    "ready": re.compile(r"\bready: serving"),
}
UP_MILESTONES = {  # first line of `orchestrator up`'s output matching each, in order
    "agents": re.compile(r"agent|preflight", re.IGNORECASE),
    "launching": re.compile(r"launching \d+ ranks"),
    "joined": re.compile(r"\brank \d+ of \d+ \(backend"),
    "loaded": re.compile(r"\bloaded .* in [\d.]+ s"),
    "rank_ready": re.compile(r"\bready: serving"),
    "ready": re.compile(r"state launching -> ready"),
}


def import_cost(module: str) -> dict[str, float]:
    """Wall and CPU seconds of a fresh interpreter importing `module`."""
    code = (
        "import os, time; t = time.perf_counter(); import " + module +
        "; c = os.times(); print(time.perf_counter() - t, c.user + c.system)"
    )
    started = time.perf_counter()
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.split()
    return {"process_s": time.perf_counter() - started, "import_s": float(out[0]),
            "cpu_s": float(out[1])}


def log_times(text: str) -> dict[str, float]:
    """Each milestone's last occurrence in a rank's log, as epoch seconds."""
    found: dict[str, float] = {}
    for line in text.splitlines():
        stamp = STAMP.match(line)
        if not stamp:
            continue
        for name, pattern in RANK_MILESTONES.items():
            if pattern.search(line):
                when = datetime.strptime(stamp.group(1), "%Y-%m-%d %H:%M:%S,%f")
                found[name] = when.timestamp()
    return found


def ranks_run(model: Path, world: int, work: Path) -> dict[str, float]:
    started, polled = time.time(), time.process_time()
    with rank_cluster(work, model, world) as cluster:
        ready, polled = time.time(), time.process_time() - polled
        logs = [log_times(cluster.log_text(r)) for r in range(world)]
        cpu = sum(_cpu_of(p.pid) for p in cluster.procs)
    # cpu_s: the ranks' CPU until ready; waiter_cpu_s: this process's (the start, the polls)
    phases = {"total": ready - started, "cpu_s": cpu, "waiter_cpu_s": polled}
    last = started
    for name in RANK_MILESTONES:
        times = [log[name] for log in logs if name in log]
        if times:
            phases[name] = max(times) - last
            last = max(times)
    phases["poll"] = ready - last
    return phases


def _cpu_of(pid: int) -> float:
    import psutil

    times = psutil.Process(pid).cpu_times()
    return times.user + times.system


def _cpu_tree(pid: int) -> list[float]:
    import psutil

    found = []
    for child in psutil.Process(pid).children(recursive=True):
        with contextlib.suppress(psutil.Error):
            found.append(_cpu_of(child.pid))
    return found


def up_run(model: Path, work: Path) -> dict[str, float]:
    work.mkdir(parents=True)
    config = write_cluster(work, str(model), [{"name": "a", "ip": "127.0.0.1"}])
    port = tomllib.loads(config.read_text())["api"]["port"]
    polled = time.process_time()
    orch = Orchestrator(config)
    try:
        orch.wait_ready(f"http://127.0.0.1:{port}", 300)
        ready, polled = time.monotonic(), time.process_time() - polled
        lines = list(orch.lines)
        cpu = {"orchestrator_cpu_s": _cpu_of(orch.process.pid),
               "agent_and_ranks_cpu_s": sum(_cpu_tree(orch.process.pid))}
    finally:
        orch.stop()
    phases = {"total": ready - orch.started, **cpu, "waiter_cpu_s": polled}
    last = orch.started
    for name, pattern in UP_MILESTONES.items():
        when = next((t for t, line in lines if pattern.search(line)), None)
        if when is not None and when >= last:
            phases[name] = when - last
            last = when
    phases["poll"] = ready - last
    log = "\n".join(f"{t - orch.started:8.3f} {line}" for t, line in lines)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "startup-up.log").write_text(log)
    return phases


def median(runs: list[dict[str, float]]) -> dict[str, float]:
    keys = dict.fromkeys(k for run in runs for k in run)
    return {k: statistics.median(run[k] for run in runs if k in run) for k in keys}


def show(title: str, figures: dict[str, float]) -> None:
    print(f"{title:24} " + "  ".join(f"{k} {v:.2f}" for k, v in figures.items()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--only", nargs="*", default=["imports", "ranks", "up"])
    args = parser.parse_args()
    results: dict[str, Any] = {}
    if "imports" in args.only:
        for module in IMPORTS:
            results[f"import {module}"] = median(
                [import_cost(module) for _ in range(args.repeats)])
            show(f"import {module}", results[f"import {module}"])
    with tempfile.TemporaryDirectory(prefix="bench-startup-") as tmp:
        work = Path(tmp)
        model = write_tiny_model(work / "tiny", model_cache_dir=default_cache_dir())
        if "ranks" in args.only:
            for world in (1, 2):
                runs = [ranks_run(model, world, work / f"r{world}-{i}")
                        for i in range(args.repeats)]
                results[f"ranks {world}"] = median(runs)
                show(f"ranks {world}", results[f"ranks {world}"])
        if "up" in args.only:
            runs = [up_run(model, work / f"up-{i}") for i in range(args.repeats)]
            results["up 1 node"] = median(runs)
            show("up 1 node", results["up 1 node"])
    out = results_path("startup")
    out.write_text(json.dumps(results, indent=2))
    print(f"figures: {out}")


if __name__ == "__main__":
    main()
