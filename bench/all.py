"""Benchmark set: serving.py, latency.py and gateway.py one after the other, in one run.

Throughput, latency and the gateway (on the bundled and the tiny model), so their figures
come from the same machine state.

    .venv/bin/python bench/all.py [--ranks 1 3] [--quick]

Each script writes its own bench/results/<name>-<timestamp>.json; this one writes
bench/results/all-<timestamp>.json naming them, with each script's wall time.
`--quick` shortens every script (fewer repeats, pairs and idle time) for a smoke run.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from results_file import RESULTS, results_path

REPO = Path(__file__).resolve().parents[1]

QUICK = {
    "serving": ["--repeats", "1", "--max-tokens", "32"],
    "latency": ["--idle-s", "10", "--idle-pairs", "1"],
    "gateway": ["--pairs", "10", "--repeats", "1", "--models-pairs", "50"],
    "gateway-tiny": ["--pairs", "10", "--repeats", "1", "--models-pairs", "50"],
}
# The bundled model end to end on the whole machine; the tiny model, which prefills in
# milliseconds, with the gateway on a core of its own: its TTFT pairs resolve the proxy's cost.
EXTRA = {"gateway": ["--no-pin"], "gateway-tiny": ["--model", "tiny", "--pin"]}
RANKS = {"gateway-tiny": [1, 2]}


def run_one(name: str, ranks: list[int], quick: bool) -> dict[str, Any]:
    script = name.removesuffix("-tiny")
    before = set(RESULTS.glob(f"{script}-*.json"))
    argv = [sys.executable, str(REPO / "bench" / f"{script}.py")]
    argv += ["--ranks", *map(str, RANKS.get(name, ranks)), *EXTRA.get(name, [])]
    argv += QUICK[name] if quick else []
    print(f"== {' '.join(argv[1:])}", flush=True)
    started = time.monotonic()
    code = subprocess.run(argv, cwd=REPO, check=False).returncode
    written = sorted(set(RESULTS.glob(f"{script}-*.json")) - before)
    return {"exit_code": code, "wall_s": round(time.monotonic() - started, 1),
            "figures": [str(p.relative_to(REPO)) for p in written]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 3])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--only", nargs="+", choices=list(QUICK), default=list(QUICK))
    args = parser.parse_args()
    summary = {name: run_one(name, args.ranks, args.quick) for name in args.only}
    out = results_path("all")
    out.write_text(json.dumps(summary, indent=2), encoding="utf-8")
    print(json.dumps(summary, indent=2))
    print(f"summary: {out}")
    sys.exit(max(s["exit_code"] for s in summary.values()))


if __name__ == "__main__":
    main()
