"""Benchmark: clusters across network namespaces (needs root, iproute2, OpenSSH's sshd).

1. `up` -> ready: 3 hosts on a switch serving the bundled model, time from `up` to
   /health 200, and to the first completion (repeated --runs times).
2. linktest on a ring of 3 hosts: unshaped, then with the h0-h1 cable shaped to 200 Mbit/s
   (tbf): latency p50/p99, all_sum bandwidth, GB/s per cable.
3. Link faults on 2 hosts serving the tiny model under a steady load (one client, small
   completions back to back): the worker's data link down, then dropping every packet,
   each held --hold-s (default 20 s), --runs times: detected (/health left ready) after
   the fault, serving again (first 200) after the link came back, and the requests that
   overlapped the fault: ok / ended with an error event or status / hung.

    sudo .venv/bin/python bench/multihost.py [--runs 3] [--hold-s 20]

Figures go to bench/results/multihost-<time>.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import tomllib
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import tomli_w

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from results_file import results_path  # noqa: E402

from serving.model.bundled import default_cache_dir  # noqa: E402
from testkit.load import Load, fault  # noqa: E402
from testkit.netns import MultiHost, multi_host  # noqa: E402
from testkit.orchestrator_process import Orchestrator, run_cli, write_cluster  # noqa: E402
from testkit.tiny_model import write_tiny_model  # noqa: E402

BUNDLED = "bundled:smollm2-135m-instruct"
FAST = {"supervisor": {"backoff_initial_s": 0.5, "stop_grace_s": 2.0}}


def api_url(config: Path) -> str:
    api = tomllib.loads(config.read_text())["api"]
    return f"http://{api['host']}:{api['port']}"


def spread(values: list[float]) -> dict[str, float]:
    return {"min": min(values), "median": statistics.median(values), "max": max(values)}


def up_to_ready(tmp: Path, runs: int) -> dict[str, Any]:
    ready, first = [], []
    for run in range(runs):
        with multi_host(3, "switch", tmp / f"up{run}") as net:
            nodes = [net.node(i) for i in range(3)]
            config = write_cluster(tmp / f"up{run}", BUNDLED, nodes, **FAST)
            url, started = api_url(config), time.monotonic()
            orchestrator = Orchestrator(config)
            try:
                orchestrator.wait_ready(url)
                ready.append(time.monotonic() - started)
                body = {"model": "smollm2-135m-instruct", "prompt": "Hi", "max_tokens": 1}
                httpx.post(f"{url}/v1/completions", json=body, timeout=300).raise_for_status()
                first.append(time.monotonic() - started)
            finally:
                orchestrator.stop()
    return {"ready_s": spread(ready), "first_completion_s": spread(first)}


def ring_config(tmp: Path, net: MultiHost) -> Path:
    config = write_cluster(tmp, BUNDLED, [net.node(i) for i in range(3)])
    data = tomllib.loads(config.read_text())
    data["links"] = net.links()
    config.write_text(tomli_w.dumps(data))
    return config


def linktests(tmp: Path) -> dict[str, Any]:
    results = {}
    with multi_host(3, "ring", tmp / "ring") as net:
        config = ring_config(tmp / "ring", net)
        for label in ("unshaped", "h0-h1 shaped to 200mbit"):
            if label != "unshaped":
                net.shape(0, 1, rate="200mbit")
            out = run_cli("linktest", str(config), "--json", timeout=300)
            results[label] = json.loads(out.stdout)
    return results


def link_faults(tmp: Path, runs: int, hold_s: float) -> dict[str, Any]:
    model = write_tiny_model(tmp / "tiny", model_cache_dir=default_cache_dir())
    figures: dict[str, Any] = {}
    for kind in ("link down", "100% loss"):
        rows = []
        for run in range(runs):
            where = tmp / f"{kind.replace(' ', '-').replace('%', '')}{run}"
            with multi_host(2, "switch", where) as net:
                rows.append(one_fault(where, net, model, kind, hold_s))
        figures[kind] = {
            "runs": rows,
            "detected_s": spread([r["detected_s"] for r in rows if r["detected_s"] is not None]),
            "serving_again_s": spread([r["serving_again_s"] for r in rows]),
        }
    return figures


def one_fault(tmp: Path, net: MultiHost, model: Path, kind: str, hold_s: float) -> dict[str, Any]:
    settings = {**FAST, "serving": {"request_timeout_s": 60.0}}
    config = write_cluster(tmp, str(model), [net.node(0), net.node(1)], **settings)
    url = api_url(config)
    apply, revert = {
        "link down": (lambda: net.link_down(1), lambda: net.link_up(1)),
        "100% loss": (lambda: net.drop_all(1), lambda: net.clear(1)),
    }[kind]
    orchestrator = Orchestrator(config)
    try:
        orchestrator.wait_ready(url)
        with Load(url, model.name, 60.0) as load:
            time.sleep(3.0)
            times = fault(url, load, apply, revert, hold_s)
            time.sleep(1.0)
        overlapping = load.between(times.applied, times.served_again or time.monotonic())
    finally:
        orchestrator.stop()
    return {
        "detected_s": times.detected_s,
        "serving_again_s": times.serving_again_s,
        "ready_again_s": None if times.ready_again is None else times.ready_again - times.reverted,
        "requests": dict(Counter(o.result for o in overlapping)),
        "hung": len(load.hung()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--hold-s", type=float, default=20.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="mco-bench-") as tmp:
        figures = {
            "up": up_to_ready(Path(tmp), args.runs),
            "linktest": linktests(Path(tmp)),
            "faults": link_faults(Path(tmp), args.runs, args.hold_s),
        }
    out = results_path("multihost")
    out.write_text(json.dumps(figures, indent=2))
    print(json.dumps(figures, indent=2))
    print(f"figures: {out}")


if __name__ == "__main__":
    main()
