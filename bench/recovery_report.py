"""The recovery benchmark's report: figures per milestone, targets, phases, the JSON file."""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

KILLED_RANK = 1
HEALTH_POLL_S = 0.1

# Lines of the orchestrator's output that mark a milestone.
FAILURE = re.compile(r"failure: (.*)")
STATE = re.compile(r"state (\w+) -> (\w+)")
RELAUNCH = re.compile(r"backoff ([\d.]+) s \(restart")
LAUNCHING = re.compile(r"launching (\d+) ranks, launch (\S+)")
RANK_LINE = re.compile(r"\[\S+ r(\d+)\] (.*)")
JOINED = re.compile(r"\brank \d+ of \d+ \(backend")
LOADED = re.compile(r"\bloaded .* in ([\d.]+) s")


@dataclass
class Run:
    launch_before: str = ""
    launch_after: str = ""
    killed_pid: int = 0
    cause: str = ""
    restarts_delta: float = 0.0
    backoff_s: float | None = None
    warm_request_s: float = 0.0  # a request's latency on the warm gang, before the kill
    load_s: dict[int, float] = field(default_factory=dict)  # rank -> `loaded in X s`
    launch_duration_s: float | None = None  # histogram delta: this relaunch
    recovery_metric_s: float | None = None  # orchestrator_recovery_seconds delta
    held_status: str = ""
    retry_attempts: list[tuple[float, float, str]] = field(default_factory=list)  # sent, done
    t: dict[str, float] = field(default_factory=dict)  # milestone -> seconds after the kill


# ── what the output and the metrics say ──


def read_milestones(run: Run, lines: list[tuple[float, str]], t_kill: float, ranks: int) -> None:
    joined: dict[int, float] = {}
    loaded: dict[int, float] = {}

    def mark(name: str, t: float) -> None:
        run.t.setdefault(name, t - t_kill)

    for t, line in lines:
        if FAILURE.search(line):
            mark("detected", t)
        elif (state := STATE.search(line)) and state.group(2) in ("restarting", "ready"):
            mark(state.group(2), t)
        elif relaunch := RELAUNCH.search(line):
            mark("stopped", t)
            run.backoff_s = float(relaunch.group(1))
        elif LAUNCHING.search(line):
            mark("launching", t)
        elif (rank_line := RANK_LINE.search(line)) and run.launch_after in line:
            rank, text = int(rank_line.group(1)), rank_line.group(2)
            if JOINED.search(text):
                joined.setdefault(rank, t)
            elif load := LOADED.search(text):
                loaded.setdefault(rank, t)
                run.load_s[rank] = float(load.group(1))
    if len(joined) == ranks:
        mark("joined", max(joined.values()))
    if len(loaded) == ranks:
        mark("loaded", max(loaded.values()))


def metric_deltas(run: Run, before: dict[str, float], after: dict[str, float]) -> None:
    def delta(name: str) -> float:
        return after.get(name, 0.0) - before.get(name, 0.0)

    run.restarts_delta = sum(
        after[k] - before.get(k, 0.0) for k in after if k.startswith("orchestrator_restarts_total")
    )
    for attr, hist in (
        ("launch_duration_s", "orchestrator_launch_duration_seconds"),
        ("recovery_metric_s", "orchestrator_recovery_seconds"),
    ):
        if delta(f"{hist}_count") == 1:
            setattr(run, attr, delta(f"{hist}_sum"))


# ── report ──

ROWS = [  # (label, key in Run.t or a Run attribute); all in seconds
    ("kill -> failure detected (log line)", "detected"),
    ("kill -> state restarting", "restarting"),
    ("kill -> /health 503 (polled every 0.1 s)", "health_503"),
    ("kill -> gang stopped, restart counted", "stopped"),
    ("kill -> relaunch (backoff over)", "launching"),
    ("kill -> all ranks joined (init)", "joined"),
    ("kill -> all ranks loaded", "loaded"),
    ("kill -> state ready", "ready"),
    ("kill -> /health 200", "health_200"),
    ("kill -> request sent at kill: 200", "served_held"),
    ("kill -> request sent in restart: 200", "served_retry"),
    ("warm request latency before the kill", "warm_request_s"),
    ("model load, slowest rank", "load"),
    ("launch duration (histogram)", "launch_duration_s"),
    ("recovery (histogram: detected->ready)", "recovery_metric_s"),
]


def value(run: Run, key: str) -> float | None:
    if key == "load":
        return max(run.load_s.values()) if run.load_s else None
    if key in run.t:
        return run.t[key]
    attr = getattr(run, key, None)
    return attr if isinstance(attr, float) else None


def spread(values: list[float]) -> dict[str, float]:
    return {"min": min(values), "median": statistics.median(values), "max": max(values)}


def summarize(runs: list[Run]) -> dict[str, dict[str, float]]:
    summary = {}
    for _label, key in ROWS:
        values = [v for run in runs if (v := value(run, key)) is not None]
        if values:
            summary[key] = {**spread(values), "n": len(values)}
    return summary


def targets(runs: list[Run]) -> dict[str, str]:
    """The issue's targets, as passed/total runs."""

    def passed(key: str, limit: Any) -> str:
        ok = sum(
            1
            for run in runs
            if key in run.t and (bound := limit(run)) is not None and run.t[key] <= bound
        )
        return f"{ok}/{len(runs)} runs"

    def load_plus_3(run: Run) -> float | None:
        load = value(run, "load")
        return None if load is None else load + 3.0

    def load_plus_3_plus_request(run: Run) -> float | None:
        bound = load_plus_3(run)
        return None if bound is None else bound + run.warm_request_s

    return {
        "detected within 1 s": passed("detected", lambda run: 1.0),
        "served within load + 3 s (request sent at kill)": passed("served_held", load_plus_3),
        "served within load + 3 s + a warm request's latency": passed(
            "served_held", load_plus_3_plus_request
        ),
        "state ready within load + 3 s (supervisor's part)": passed("ready", load_plus_3),
    }


PHASES = [  # (label, milestone that ends it); each phase starts at the previous milestone
    ("detect (exit event reaches the supervisor)", "detected"),
    ("detected -> restarting", "restarting"),
    ("stop gang (SIGTERM, grace, SIGKILL)", "stopped"),
    ("backoff", "launching"),
    ("spawn + imports + ring init", "joined"),
    ("model load + barrier", "loaded"),
    ("rank 0 API up + ready poll", "ready"),
    ("first request on the new gang", "served_held"),
]


def phases(runs: list[Run]) -> list[tuple[str, float]]:
    """Where the recovery goes: each phase's median duration over the runs."""
    durations: dict[str, list[float]] = {}
    for run in runs:
        previous = 0.0
        for label, key in PHASES:
            if key in run.t:
                durations.setdefault(label, []).append(run.t[key] - previous)
                previous = run.t[key]
    return [
        (label, statistics.median(durations[label])) for label, _key in PHASES if label in durations
    ]


def print_report(runs: list[Run], summary: dict[str, Any], initial: dict[str, Any]) -> None:
    print(f"\n{len(runs)} runs; seconds (min / median / max)")
    print(f"{'':44} {'min':>7} {'median':>7} {'max':>7}")
    for label, key in ROWS:
        if key in summary:
            s = summary[key]
            print(f"{label:44} {s['min']:7.2f} {s['median']:7.2f} {s['max']:7.2f}")
    print("\nmedian recovery by phase:")
    for label, seconds in phases(runs):
        print(f"  {label:44} {seconds:6.2f}")
    print(
        f"\ninitial launch: load {initial.get('load_s')} s per rank, "
        f"launch duration {initial.get('launch_duration_s')} s"
    )
    for name, verdict in targets(runs).items():
        print(f"target {name}: {verdict}")


def write(
    out: Path,
    args: argparse.Namespace,
    supervisor: dict[str, Any],
    runs: list[Run],
    initial: dict[str, Any],
    killed: list[int],
    left: list[int],
) -> None:
    summary = summarize(runs)
    print_report(runs, summary, initial)
    meta = {
        "model": args.model,
        "ranks": args.ranks,
        "runs": args.runs,
        "killed_rank": KILLED_RANK,
        "supervisor_overrides": supervisor,
        "health_poll_s": HEALTH_POLL_S,
        "max_tokens": 2,
        "cpu_count": os.cpu_count(),
        "load_average": os.getloadavg(),
        "ld_preload": os.environ.get("LD_PRELOAD", ""),
    }
    out.write_text(
        json.dumps(
            {
                "meta": meta,
                "initial_launch": initial,
                "summary": summary,
                "phases_median": phases(runs),
                "targets": targets(runs),
                "runs": [asdict(run) for run in runs],
                "cleanup": {"killed_after_stop": killed, "left": left},
            },
            indent=2,
        )
    )
    print(f"\nwrote {out}")
