"""Benchmark: our serving ranks vs mlx_lm.server, side by side, same model/ranks/machine.

Every server's ranks are started directly with MLX_RANK + MLX_HOSTFILE (never through
mlx.launch, whose output relay busy-loops). For each rank count and server it measures
1 stream (TTFT, decode tok/s) and N concurrent streams (aggregate tok/s), repeated,
reporting min/median/max; for ours also the plan header collective's own time as a share
of step time (serving_step_comm_seconds with comm_profile on: timed alone, after draining
the stream, so it leaves out what the extra rendezvous costs the step; bench/step_comm.py
measures that against the bare forward pass). Figures go to
bench/results/serving-<timestamp>.json and a table is printed.

    .venv/bin/python bench/serving.py --model bundled:smollm2-135m-instruct --ranks 1 3
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from results_file import results_path  # noqa: E402

from contract.blas import find_openblas  # noqa: E402
from contract.settings import ModelSettings, RankSettings  # noqa: E402
from orchestrator.loadgen.streams import chat_body, concurrent_streams, stream_chat  # noqa: E402
from serving.model.loading import resolve  # noqa: E402
from testkit.ports import free_ports  # noqa: E402
from testkit.rank_cluster import rank_cluster  # noqa: E402

PROMPT = "Write a long, detailed story about a lighthouse keeper and a storm."


@dataclass
class Figures:
    server: str
    ranks: int
    ttft_s: list[float] = field(default_factory=list)
    decode_tok_s: list[float] = field(default_factory=list)
    aggregate_tok_s: dict[int, list[float]] = field(default_factory=dict)
    comm_share: float | None = None
    step_s: float | None = None


def stream_once(base_url: str, model: str, max_tokens: int, tag: str) -> tuple[float, list[float]]:
    """One streaming chat request; returns (start time, arrival time of each content chunk)."""
    with httpx.Client(timeout=1800) as client:
        times = stream_chat(client, base_url, chat_body(model, f"[{tag}] {PROMPT}", max_tokens))
    if times.error:
        raise RuntimeError(f"stream to {base_url} failed: {times.error}")
    return times.started, times.arrivals


def measure(base_url: str, model: str, fig: Figures, args: argparse.Namespace, rep: int) -> None:
    """One repetition: a warmup, 1 stream, then each concurrency level."""
    stream_once(base_url, model, 8, f"warmup{rep}")
    start, arrivals = stream_once(base_url, model, args.max_tokens, f"s{rep}")
    fig.ttft_s.append(arrivals[0] - start)
    if len(arrivals) > 2:
        fig.decode_tok_s.append((len(arrivals) - 1) / (arrivals[-1] - arrivals[0]))
    print(f"  {fig.server} {fig.ranks}r single #{rep}: ttft {fig.ttft_s[-1]:.2f} s, "
          f"decode {fig.decode_tok_s[-1]:.2f} tok/s", flush=True)
    for n in args.concurrency:
        rate = concurrent_rate(base_url, model, n, args.max_tokens, f"c{n}-{rep}")
        fig.aggregate_tok_s.setdefault(n, []).append(rate)
        print(f"  {fig.server} {fig.ranks}r {n} streams #{rep}: {rate:.2f} tok/s", flush=True)


def concurrent_rate(base_url: str, model: str, n: int, max_tokens: int, tag: str) -> float:
    """Aggregate tok/s of n simultaneous streams, first start to last end."""
    bodies = [chat_body(model, f"[{tag}-{i}] {PROMPT}", max_tokens) for i in range(n)]
    times, wall = concurrent_streams(base_url, bodies)
    if failed := [t.error for t in times if t.error]:
        raise RuntimeError(f"{len(failed)} of {n} streams to {base_url} failed: {failed[0]}")
    return sum(len(t.arrivals) for t in times) / wall


def metric_sum(base_url: str, name: str) -> float:
    text = httpx.get(f"{base_url}/metrics", timeout=10).text
    return sum(float(v) for v in re.findall(rf"^{name} (\S+)$", text, re.MULTILINE))


def bench_ours(
    model_dir: Path, ranks: int, args: argparse.Namespace, fig: Figures, rep: int
) -> None:
    work = args.workdir / f"ours-{ranks}-{rep}"
    with rank_cluster(work, model_dir, ranks, served_model_id="m", max_batch_size=8) as c:
        measure(c.base_url, "m", fig, args, rep)


def profile_ours(model_dir: Path, ranks: int, args: argparse.Namespace, fig: Figures) -> None:
    """A short run with comm_profile on: the plan header collective alone, per step time."""
    if ranks > 1:
        with rank_cluster(args.workdir / f"ours-{ranks}-profile", model_dir, ranks,
                          served_model_id="m", comm_profile=True) as c:
            stream_once(c.base_url, "m", args.max_tokens // 2, "profile")
            comm = metric_sum(c.base_url, "serving_step_comm_seconds_sum")
            steps = metric_sum(c.base_url, "serving_step_duration_seconds_sum")
            count = metric_sum(c.base_url, "serving_step_duration_seconds_count")
            fig.comm_share, fig.step_s = comm / steps, steps / count


@contextlib.contextmanager
def mlx_lm_server(
    model_dir: Path, ranks: int, workdir: Path, cpus: list[int] | None = None
) -> Iterator[str]:
    """mlx_lm.server's ranks started directly; yields rank 0's base URL. `cpus`: run them
    on these cores only (taskset), with one OpenBLAS thread per core (bench/instances.py
    --pinned: one Mac's share of this box)."""
    workdir.mkdir(parents=True, exist_ok=True)
    port = free_ports(1)[0]
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLX_")}
    cores = len(cpus) if cpus else len(os.sched_getaffinity(0))
    prefix = ["taskset", "-c", ",".join(map(str, cpus))] if cpus else []
    if blas := find_openblas():  # the BLAS our ranks load, for a like-for-like comparison
        env["LD_PRELOAD"] = blas
        threads = str(max(1, cores // ranks))
        env["OPENBLAS_NUM_THREADS"] = threads if cpus else env.get(
            "OPENBLAS_NUM_THREADS", threads)
    if ranks > 1:
        hostfile = workdir / "hostfile.json"
        hostfile.write_text(json.dumps([[f"127.0.0.1:{p}"] for p in free_ports(ranks)]))
        env["MLX_HOSTFILE"] = str(hostfile)
    procs = []
    try:
        for rank in range(ranks):
            rank_env = dict(env, MLX_RANK=str(rank)) if ranks > 1 else env
            with (workdir / f"rank{rank}.log").open("wb") as log:
                procs.append(subprocess.Popen(
                    [*prefix, sys.executable, "-m", "mlx_lm.server", "--model", str(model_dir),
                     "--port", str(port), "--max-tokens", "4096"],
                    env=rank_env, stdout=log, stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL, start_new_session=True,
                ))
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if any(p.poll() is not None for p in procs):
                raise RuntimeError(f"mlx_lm.server rank exited; see {workdir}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}/v1/models", timeout=2).status_code == 200:
                    break
            time.sleep(0.5)
        yield url
    finally:
        for p in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGTERM)
        for p in procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()


def bench_mlx_lm(
    model_dir: Path, ranks: int, args: argparse.Namespace, fig: Figures, rep: int
) -> None:
    with mlx_lm_server(model_dir, ranks, args.workdir / f"mlx_lm-{ranks}-{rep}") as url:
        measure(url, str(model_dir), fig, args, rep)


def spread(values: list[float]) -> str:
    if not values:
        return "-"
    return f"{min(values):.2f}/{statistics.median(values):.2f}/{max(values):.2f}"


def print_table(figures: list[Figures], concurrency: list[int]) -> None:
    heads = ["server", "ranks", "TTFT s", "1-stream tok/s"]
    heads += [f"{n}-stream agg tok/s" for n in concurrency] + ["plan header alone"]
    print("\n(min/median/max)\n" + " | ".join(heads))
    for f in figures:
        row = [f.server, str(f.ranks), spread(f.ttft_s), spread(f.decode_tok_s)]
        row += [spread(f.aggregate_tok_s.get(n, [])) for n in concurrency]
        row.append("-" if f.comm_share is None else f"{100 * f.comm_share:.2f}%")
        print(" | ".join(row))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="bundled:smollm2-135m-instruct")
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 3])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[4, 8])
    parser.add_argument("--servers", nargs="+", default=["ours", "mlx_lm"])
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/serving-bench"))
    args = parser.parse_args()
    settings = RankSettings(model=ModelSettings(path=args.model))
    model_dir = resolve(settings, float32=find_openblas() is not None)  # as the ranks serve it
    figures: list[Figures] = []
    for ranks in args.ranks:
        # Servers alternate within each repetition (each started fresh), so drift in
        # the machine's load (2 shared cores) does not favour whichever ran first.
        figs = {s: Figures("ours" if s == "ours" else "mlx_lm.server", ranks)
                for s in args.servers}
        for rep in range(args.repeats):
            for server, fig in figs.items():
                bench = bench_ours if server == "ours" else bench_mlx_lm
                bench(model_dir, ranks, args, fig, rep)
        if "ours" in figs:
            profile_ours(model_dir, ranks, args, figs["ours"])
        figures.extend(figs.values())
    print_table(figures, args.concurrency)
    out = results_path("serving")
    meta = {"model": args.model, "max_tokens": args.max_tokens, "repeats": args.repeats,
            "cpu_count": os.cpu_count(), "ld_preload": os.environ.get("LD_PRELOAD", "")}
    out.write_text(json.dumps({"meta": meta, "figures": [asdict(f) for f in figures]}, indent=2))
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
