"""Benchmark: how fast the supervisor recovers from kill -9 of a worker rank.

Starts a real `orchestrator up` (N local ranks over ring, the demo cluster by default),
then per run: with the cluster ready and warm (two requests served), SIGKILLs rank 1 and
times, from the kill,

    detected    the supervisor's `failure: ...` log line, timestamped here as it arrives
                on the orchestrator's stderr (the log's own timestamps have 1 s resolution)
    restarting  `state ready -> restarting`; /health 503 as polled
    stopped     `backoff ...: relaunching in ...`: gang stopped, restart counted
    launching   `launching N ranks`: backoff over
    joined      every rank printed `rank R of N`: process start + imports + ring init
    loaded      every rank printed `loaded ... in X s` (X: its model load time)
    ready       `state launching -> ready` (the supervisor polls rank 0 every 0.1 s)
    served      a request (max_tokens 2, temperature 0) sent right after the kill, so it
                reaches the dying gang and must be resent, completes with 200; and a
                request sent once /health says restarting (held by the gateway), resent
                until it gets a 200

Next to it: the model load time (slowest rank's `loaded ... in X s`), the launch
duration (`orchestrator_launch_duration_seconds`), and a request's latency on the warm
gang. Targets (issue 6): detected within 1 s; served within load time + 3 s.
The orchestrator's output goes to bench/results/recovery-<ts>.log, figures to .json.

Supervisor settings are the defaults except: `backoff_reset_after_s` 1 s (so every run
pays the first-failure backoff, not a doubled one; the bench waits 3 s after each
recovery) and `max_restarts` runs + 2 (so the budget never ends the benchmark). With
`standby_ranks` on (the default) each run waits until the next launch's standby ranks
are started and then 5 s more (their imports), as a cluster in steady state has them;
`--no-standby` measures cold relaunches.

    .venv/bin/python bench/recovery.py [--model bundled:smollm2-135m-instruct|PATH]
                                       [--ranks 3] [--runs 5]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import signal
import sys
import tempfile
import threading
import time
import tomllib
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from results_file import results_path  # noqa: E402

from bench.recovery_report import (  # noqa: E402
    HEALTH_POLL_S,
    KILLED_RANK,
    LAUNCHING,
    LOADED,
    RANK_LINE,
    Run,
    metric_deltas,
    read_milestones,
    value,
    write,
)
from contract.settings import ServingSettings  # noqa: E402
from orchestrator.config.spec import SupervisorSection  # noqa: E402
from testkit.orchestrator_process import (  # noqa: E402
    Orchestrator,
    alive,
    end_session,
    launch_processes,
    write_cluster,
)

RESET_AFTER_S = 1.0
WATCH_S = 1.0  # supervisor.WATCH_S: how often note_ready (the backoff reset) runs
RUN_TIMEOUT_S = 600.0

STANDBY = re.compile(r"rank \d+ standby on \S+: pid \d+, launch (\S+)")
STANDBY_SETTLE_S = 5.0  # after the standbys are started: their imports finish


# ── the orchestrator under test ──


def write_bench_cluster(
    tmp: Path, model: str, ranks: int, runs: int, standby: bool
) -> tuple[Path, dict[str, Any]]:
    """The demo cluster (N local ranks over ring) on free ports; returns (path, supervisor).
    Defaults everywhere but the supervisor overrides the docstring names."""
    supervisor = {
        "backoff_reset_after_s": RESET_AFTER_S,
        "max_restarts": runs + 2,
        "standby_ranks": standby,
    }
    nodes = [{"name": f"rank{i}", "transport": "local", "ip": "127.0.0.1"} for i in range(ranks)]
    spec = SupervisorSection()  # testkit sets these for tests: back to cluster.toml's defaults
    defaults = {"stop_grace_s": spec.stop_grace_s, "launch_timeout_s": spec.launch_timeout_s}
    path = write_cluster(
        tmp,
        model,
        nodes,
        cluster={"name": "recovery-bench", "backend": "ring"},
        serving={"keepalive_s": ServingSettings().keepalive_s},
        supervisor={**defaults, **supervisor},
    )
    return path, supervisor


class BenchOrchestrator(Orchestrator):
    """testkit's `orchestrator up`, read back over HTTP and by its timestamped log lines."""

    def __init__(self, config: Path, url: str) -> None:
        super().__init__(config)
        self.url = url
        self.http = httpx.Client(timeout=10)  # one client: a new one per poll costs CPU

    @property
    def launch_ids(self) -> set[str]:
        return {m.group(2) for _t, line in list(self.lines) if (m := LAUNCHING.search(line))}

    def since(self, t0: float) -> list[tuple[float, str]]:
        return [(t, line) for t, line in list(self.lines) if t >= t0]

    def save_output(self, path: Path) -> None:
        """Its whole output, each line prefixed with seconds since it was started."""
        path.write_text("".join(f"+{t - self.started:9.3f} {line}\n" for t, line in self.lines))

    def tail(self, n: int = 60) -> str:
        return "\n".join(self.output[-n:])

    def status(self) -> dict[str, Any]:
        return dict(self.http.get(f"{self.url}/status").json())

    def metrics(self) -> dict[str, float]:
        """orchestrator_* samples by name{labels}."""
        text = self.http.get(f"{self.url}/metrics").text
        values = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                labels = ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items()))
                values[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
        return values

    def wait_launch_ready(
        self, not_launch: str = "", timeout_s: float = RUN_TIMEOUT_S
    ) -> dict[str, Any]:
        """Wait for state ready under a launch id other than not_launch; returns the status."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"orchestrator exited {self.process.returncode}:\n{self.tail()}")
            with contextlib.suppress(httpx.HTTPError, ValueError):
                status = self.status()
                if status["state"] == "ready" and status["launch_id"] != not_launch:
                    self.remember_descendants()
                    return status
            time.sleep(0.25)
        raise RuntimeError(f"not ready within {timeout_s:g} s:\n{self.tail()}")

    def stop_all(self) -> list[int]:
        """SIGTERM (then SIGKILL to its session); returns PIDs of ours that had to be killed."""
        self.http.close()
        end_session(self.process)
        leftovers = alive(self.descendants) | set(launch_processes(*self.launch_ids))
        for pid in leftovers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return sorted(leftovers)


class HealthWatch:
    """Polls the gateway's /health; keeps each change of its status code with its time."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.changes: list[tuple[float, int]] = []
        self._stop = threading.Event()
        threading.Thread(target=self._poll, daemon=True).start()

    def _poll(self) -> None:
        with httpx.Client(timeout=2.0) as client:
            while not self._stop.is_set():
                try:
                    code = client.get(f"{self.url}/health").status_code
                except httpx.HTTPError:
                    code = 0
                if not self.changes or self.changes[-1][1] != code:
                    self.changes.append((time.monotonic(), code))
                self._stop.wait(HEALTH_POLL_S)

    def first(self, after: float, ok: bool) -> float | None:
        return next((t for t, code in self.changes if t >= after and (code == 200) == ok), None)

    def close(self) -> None:
        self._stop.set()


# ── one run ──


def complete(url: str, model: str, timeout_s: float) -> int:
    response = httpx.post(
        f"{url}/v1/completions",
        timeout=timeout_s,
        json={"model": model, "prompt": "Hello", "max_tokens": 2, "temperature": 0},
    )
    return response.status_code


def attempt(url: str, model: str, timeout_s: float) -> str:
    """One request's outcome: its status code, or the client error's name."""
    try:
        return str(complete(url, model, timeout_s))
    except httpx.HTTPError as exc:
        return type(exc).__name__


def held_request(url: str, model: str, t_kill: float, run: Run, _health: HealthWatch) -> None:
    """Sent right after the kill, so it reaches the dying gang: the gateway must resend it."""
    run.held_status = attempt(url, model, RUN_TIMEOUT_S)
    if run.held_status == "200":
        run.t["served_held"] = time.monotonic() - t_kill


def retry_client(url: str, model: str, t_kill: float, run: Run, health: HealthWatch) -> None:
    """Starts once /health says restarting (the gateway holds it); resends until a 200."""
    deadline = t_kill + RUN_TIMEOUT_S
    while health.first(t_kill, ok=False) is None and time.monotonic() < deadline:
        time.sleep(0.02)
    while time.monotonic() < deadline:
        sent = time.monotonic() - t_kill
        outcome = attempt(url, model, RUN_TIMEOUT_S)
        done = time.monotonic() - t_kill
        run.retry_attempts.append((round(sent, 3), round(done, 3), outcome))
        if outcome == "200":
            run.t["served_retry"] = done
            return
        time.sleep(0.2)


def warm_up(url: str, model: str) -> float:
    """Two requests, so the kill hits a gang that serves; returns the second one's latency."""
    for _ in range(2):
        started = time.monotonic()
        if (outcome := attempt(url, model, RUN_TIMEOUT_S)) != "200":
            raise RuntimeError(f"warm-up request failed: {outcome}")
    return time.monotonic() - started


def wait_for_standbys(orch: BenchOrchestrator, ranks: int, timeout_s: float = 60.0) -> None:
    """Until the next launch's ranks are all standing by (then their imports' time)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        launches = [m.group(1) for _t, line in list(orch.lines) if (m := STANDBY.search(line))]
        if launches and launches.count(launches[-1]) == ranks:
            time.sleep(STANDBY_SETTLE_S)
            return
        time.sleep(0.2)
    raise RuntimeError(f"no standby ranks within {timeout_s:g} s:\n{orch.tail()}")


def one_run(
    orch: BenchOrchestrator, health: HealthWatch, model: str, ranks: int, standby: bool
) -> Run:
    status = orch.wait_launch_ready()
    warm_s = warm_up(orch.url, model)
    time.sleep(RESET_AFTER_S + 2 * WATCH_S)  # let the backoff reset (note_ready) run
    if standby:
        wait_for_standbys(orch, ranks)
    status, before = orch.status(), orch.metrics()
    run = Run(
        launch_before=status["launch_id"],
        warm_request_s=warm_s,
        killed_pid=int(status["ranks"][KILLED_RANK]["pid"]),
    )
    if launch_processes(run.launch_before).count(run.killed_pid) != 1:
        raise RuntimeError(f"pid {run.killed_pid} is not a rank of launch {run.launch_before}")
    t_kill = time.monotonic()
    os.kill(run.killed_pid, signal.SIGKILL)
    clients = [
        threading.Thread(target=f, args=(orch.url, model, t_kill, run, health), daemon=True)
        for f in (held_request, retry_client)
    ]
    for client in clients:
        client.start()
    after = orch.wait_launch_ready(not_launch=run.launch_before)
    for client in clients:
        client.join(RUN_TIMEOUT_S)
    run.launch_after, run.cause = after["launch_id"], after["last_cause"]
    read_milestones(run, orch.since(t_kill), t_kill, ranks)
    if (down := health.first(t_kill, ok=False)) is not None:
        run.t["health_503"] = down - t_kill
        if (up := health.first(down, ok=True)) is not None:
            run.t["health_200"] = up - t_kill
    metric_deltas(run, before, orch.metrics())
    return run


# ── main ──


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="bundled:smollm2-135m-instruct")
    parser.add_argument("--ranks", type=int, default=3)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--no-standby", dest="standby", action="store_false",
                        help="standby_ranks = false: every relaunch starts cold")
    args = parser.parse_args()
    if args.ranks < 2:
        parser.error("--ranks must be at least 2 (rank 1 is the one killed)")
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # SIGTERM cleans up like Ctrl-C
    with tempfile.TemporaryDirectory(prefix="recovery-bench-") as tmp:
        config, supervisor = write_bench_cluster(
            Path(tmp), args.model, args.ranks, args.runs, args.standby
        )
        api = tomllib.loads(config.read_text())["api"]
        try:
            return bench(args, config, supervisor, f"http://{api['host']}:{api['port']}")
        except KeyboardInterrupt:
            print("interrupted", file=sys.stderr)
            return 130


def bench(args: argparse.Namespace, config: Path, supervisor: dict[str, Any], url: str) -> int:
    orch = BenchOrchestrator(config, url)
    health = HealthWatch(url)
    runs: list[Run] = []
    initial: dict[str, Any] = {}
    try:
        t0 = time.monotonic()
        status = orch.wait_launch_ready()
        initial = _initial_launch(orch, status["launch_id"], time.monotonic() - t0)
        print(
            f"ready in {initial['up_s']:.1f} s (launch {status['launch_id']}); "
            f"model {status['model']}",
            flush=True,
        )
        for i in range(args.runs):
            run = one_run(orch, health, status["model"], args.ranks, args.standby)
            runs.append(run)
            print(
                f"run {i + 1}: detected {run.t.get('detected', float('nan')):.2f} s, "
                f"ready {run.t.get('ready', float('nan')):.2f} s, served "
                f"{run.t.get('served_held', float('nan')):.2f} s (load "
                f"{value(run, 'load') or float('nan'):.2f} s); {run.cause}",
                flush=True,
            )
    except Exception:
        print("orchestrator output (last 60 lines):\n" + orch.tail(), file=sys.stderr)
        raise
    finally:
        health.close()
        # A second Ctrl-C must not cut the cleanup short and leave ranks behind.
        stops = (signal.SIGINT, signal.SIGTERM)
        previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in stops}
        killed = orch.stop_all()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        left = launch_processes(*orch.launch_ids)
        print(
            f"orchestrator stopped (exit {orch.process.returncode}); "
            f"processes killed after stop: {killed or 'none'}; "
            f"left with its launch ids: {left or 'none'}",
            flush=True,
        )
        out = results_path("recovery", "")
        orch.save_output(out.with_suffix(".log"))
        if runs:
            write(out.with_suffix(".json"), args, supervisor, runs, initial, killed, left)
        print(f"orchestrator output: {out.with_suffix('.log')}")
    return 0


def _initial_launch(orch: BenchOrchestrator, launch_id: str, up_s: float) -> dict[str, Any]:
    load = {
        int(rank.group(1)): float(loaded.group(1))
        for _t, line in orch.lines
        if launch_id in line
        and (rank := RANK_LINE.search(line))
        and (loaded := LOADED.search(rank.group(2)))
    }
    metrics = orch.metrics()
    count = metrics.get("orchestrator_launch_duration_seconds_count", 0.0)
    total = metrics.get("orchestrator_launch_duration_seconds_sum", 0.0)
    duration = total / count if count else None
    return {"up_s": up_s, "load_s": load, "launch_duration_s": duration}


if __name__ == "__main__":
    sys.exit(main())
