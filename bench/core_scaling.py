"""Benchmark: what two cores of this box give two model processes, with no server of ours.

Issue 40 asks two replicas (one node on each core: `bench/instances.py --pinned`) for
1.6x the tokens/s of one at 8 streams; they gave 1.25x, and each rank spent more CPU per
token than the one replica did. Whether the box's two vCPUs scale at all is measured here
without our server: plain mlx-lm `batch_generate` of the bundled SmolLM2 (float32,
OpenBLAS with one thread, as a pinned rank loads it) in processes pinned to a core each.
Per round: one process on core 0 decodes `--streams` prompts together, then two such
processes at once (cores 0 and 1). Each reports mlx-lm's own decode tokens/s
(`generation_tps`, after a warm-up batch) and its CPU seconds (prefill included) per
generated token. The ratio, two's summed tokens/s over one's, per round, then its median.

    .venv/bin/python bench/core_scaling.py [--rounds 3] [--streams 8] [--tokens 64]

Figures: bench/results/core-scaling-<timestamp>.json; bench/README.md (instances).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from results_file import results_path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

PROMPT = "Story {serial}: write a long tale about a lighthouse keeper and a storm."


def child(core: int, streams: int, tokens: int) -> None:
    """Pinned to `core`, one OpenBLAS thread: a warm-up batch, then the measured one; prints
    {"tps", "cpu_s_per_token"} as JSON."""
    os.sched_setaffinity(0, {core})
    os.environ["OPENBLAS_NUM_THREADS"] = "1"
    from serving.blas import load_openblas

    load_openblas()  # before mlx.core, as a rank does
    from mlx_lm import load
    from mlx_lm.generate import batch_generate

    from contract.settings import DEFAULT_MODEL
    from serving.model.bundled import default_cache_dir, resolve_model

    path = resolve_model(DEFAULT_MODEL, default_cache_dir(), float32=True)
    model, tokenizer = load(str(path))[:2]
    prompts = [tokenizer.encode(PROMPT.format(serial=i)) for i in range(streams)]
    batch_generate(model, tokenizer, prompts, max_tokens=8)  # warm-up
    cpu = time.process_time()
    stats = batch_generate(model, tokenizer, prompts, max_tokens=tokens).stats
    print(json.dumps({"tps": stats.generation_tps, "cpu_s_per_token":
                      (time.process_time() - cpu) / max(stats.generation_tokens, 1)}))


def run_children(cores: list[int], streams: int, tokens: int) -> list[dict[str, float]]:
    """One child per core, started together, `streams` each; each one's figures."""
    argv = [sys.executable, __file__, "--streams", str(streams), "--tokens", str(tokens),
            "--child"]
    procs = [subprocess.Popen([*argv, str(core)], stdout=subprocess.PIPE, text=True)
             for core in cores]
    results = []
    for proc in procs:
        out, _ = proc.communicate(timeout=900)
        if proc.returncode != 0:
            raise SystemExit(f"a child exited with {proc.returncode}")
        results.append(json.loads(out.strip().splitlines()[-1]))
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--streams", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        child(args.child, args.streams, args.tokens)
        return
    load_before = os.getloadavg()
    rounds: list[dict[str, Any]] = []
    for number in range(args.rounds):
        one = run_children([0], args.streams, args.tokens)
        two = run_children([0, 1], args.streams, args.tokens)
        ratio = sum(r["tps"] for r in two) / one[0]["tps"]
        rounds.append({"one": one, "two": two, "two_over_one": ratio})
        print(f"round {number}: " + "; ".join(
            f"{name} " + " + ".join(f"{r['tps']:.1f}" for r in found) + " tok/s ("
            + ", ".join(f"{r['cpu_s_per_token']:.4f}" for r in found) + " CPU s/token)"
            for name, found in (("one", one), ("two", two))) + f": {ratio:.2f}x")
    summary = {"two_over_one_median": statistics.median(r["two_over_one"] for r in rounds),
               "load_average_before": load_before, "args": vars(args), "rounds": rounds}
    print(f"two processes / one, median of {args.rounds}: "
          f"{summary['two_over_one_median']:.2f}x")
    out = results_path("core-scaling")
    out.write_text(json.dumps(summary, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
