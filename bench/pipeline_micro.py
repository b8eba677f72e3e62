"""Benchmark: two micro-batches in flight across 2 pipeline ranks vs the plain pipeline step.

Two ring ranks on 127.0.0.1 run bench/pipeline_micro_rank.py on the bundled SmolLM2
(float32 with OpenBLAS when it is installed, else 4-bit; a llama, pipelined through
serving/model/pipeline_dense.py), per split. Per batch size the modes take turns in each
repetition: plain (the pipelined model's own forward), serial (the prototype's schedule,
one micro-batch: the control) and micro (two micro-batches in flight;
serving/model/pipeline_micro.py). Figures: greedy decode tokens/s from an equal-length
prompt (`--steps` tokens per sequence), each rank's busy share (the share of its decode
time not spent waiting to receive), and whether each mode's tokens equal plain's.
`--model` takes another llama or dense qwen3 (the prototype drives the stages of
serving/model/pipeline_dense.py). Start it under the shared lock: it starts ranks.

    flock /tmp/mlxco-e2e.lock .venv/bin/python bench/pipeline_micro.py --reps 5
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from results_file import results_path  # noqa: E402

from contract.blas import find_openblas  # noqa: E402
from testkit.ports import free_ports  # noqa: E402

RANK_PROGRAM = REPO / "bench" / "pipeline_micro_rank.py"
MODES = ("plain", "serial", "micro")


def bundled_model() -> Path:
    from serving.model.bundled import resolve_model

    return resolve_model("bundled:smollm2-135m-instruct", float32=find_openblas() is not None)


def run_ranks(workdir: Path, model: Path, split: list[int], batches: list[int], steps: int,
              reps: int, timeout: float = 1800) -> dict[str, Any]:
    """Start one ring rank per split entry running the rank program; rank 0's report.
    Each rank runs in its own session and is killed by its process group if it outlives
    the timeout or this function fails."""
    workdir.mkdir(parents=True, exist_ok=True)
    hostfile = workdir / "hostfile.json"
    hostfile.write_text(json.dumps([[f"127.0.0.1:{p}"] for p in free_ports(len(split))]))
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLX_")}
    env["MLX_HOSTFILE"] = str(hostfile)
    args = [str(model), json.dumps(split), json.dumps(batches), str(steps), str(reps)]
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for rank in range(len(split)):
            with (workdir / f"rank{rank}.out").open("wb") as out, \
                    (workdir / f"rank{rank}.log").open("wb") as log:
                procs.append(subprocess.Popen(
                    [sys.executable, str(RANK_PROGRAM), *args], cwd=REPO,
                    env=dict(env, MLX_RANK=str(rank)), stdout=out, stderr=log,
                    stdin=subprocess.DEVNULL, start_new_session=True,
                ))
        deadline = time.monotonic() + timeout
        for proc in procs:
            proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    for rank, proc in enumerate(procs):
        if proc.returncode != 0:
            log = (workdir / f"rank{rank}.log").read_text(errors="replace")
            raise RuntimeError(f"rank {rank} exited {proc.returncode}:\n{log[-3000:]}")
    report: dict[str, Any] = json.loads((workdir / "rank0.out").read_text())
    return report


def summary(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per batch and mode: median tokens/s, median busy share per rank, all tokens equal."""
    table: dict[str, dict[str, Any]] = {}
    for batch, modes in report["batches"].items():
        row: dict[str, Any] = {}
        for mode, runs in modes.items():
            row[mode] = {
                "tok_s": statistics.median(r["tok_s"] for r in runs),
                "busy_share": _median_per_rank([r["busy_share"] for r in runs]),
                "work_ms_per_step": _median_per_rank([r["work_ms_per_step"] for r in runs]),
                "equals_plain": all(r["equals_plain"] for r in runs),
            }
        row["micro_vs_plain"] = statistics.median(
            m["tok_s"] / p["tok_s"] for m, p in zip(modes["micro"], modes["plain"], strict=True))
        table[batch] = row
    return table


def _median_per_rank(runs: list[list[float] | None]) -> list[float] | None:
    if not runs or runs[0] is None:
        return None
    return [statistics.median(r[i] for r in runs if r) for i in range(len(runs[0]))]


def print_table(split: list[int], table: dict[str, dict[str, Any]]) -> None:
    print(f"\nsplit {split} (rank 0 first): median decode tok/s "
          "[busy share rank 0/1, compute per step rank 0/1]")
    print(f"{'batch':>6}" + "".join(f"{m:>32}" for m in MODES) + f"{'micro/plain':>13}  equal")
    for batch, row in table.items():
        cells = []
        for mode in MODES:
            busy = row[mode]["busy_share"]
            work = row[mode]["work_ms_per_step"]
            shares = f" [{busy[0]:.2f}/{busy[1]:.2f} {work[0]:.0f}/{work[1]:.0f}ms]" if busy else ""
            cells.append(f"{row[mode]['tok_s']:.1f}{shares}")
        equal = all(row[m]["equals_plain"] for m in MODES)
        print(f"{batch:>6}" + "".join(f"{c:>32}" for c in cells)
              + f"{row['micro_vs_plain']:>13.2f}  {equal}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--splits", nargs="+", default=["15,15", "12,18"],
                        help="layers per rank, rank 0 (the last layers and the head) first")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--steps", type=int, default=48, help="tokens per sequence")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--model", type=Path, help="an mlx-lm model directory of a llama or "
                        "dense qwen3 (default: the bundled SmolLM2)")
    parser.add_argument("--out", type=Path, help="figures file (default: bench/results/)")
    args = parser.parse_args()
    model = args.model or bundled_model()
    results: dict[str, Any] = {"model": str(model), "cpus": os.cpu_count(), "runs": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for spec in args.splits:
            split = [int(n) for n in spec.split(",")]
            report = run_ranks(Path(tmp) / spec.replace(",", "-"), model, split,
                               args.batches, args.steps, args.reps)
            table = summary(report)
            results["runs"][spec] = {"report": report, "summary": table}
            print_table(split, table)
    out = args.out or results_path("pipeline-micro")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2))
    print(f"figures: {out}")


if __name__ == "__main__":
    main()
