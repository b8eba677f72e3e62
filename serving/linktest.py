"""`python -m serving.linktest`: measure the links between ranks with MLX's own collectives.

Started by `orchestrator linktest` on every node with the environment of a launch (ring:
MLX_RANK + MLX_HOSTFILE; jaccl: its variables), so it tests exactly what the ranks use:

- correctness: an int32 all_sum whose result every rank checks exactly;
- latency: many all_sums of one value, p50 / p99;
- bandwidth: all_sum over a sweep of sizes (4 KB to 64 MB), algorithm and bus GB/s;
- per link (ring): rank i sends to rank i+1 alone while the others wait, GB/s per cable.

Rank 0 prints one line `LINKTEST_RESULT <json>` on stdout (contract/linktest.py); every
rank exits 0, or 1 when the sums were wrong, or 3 when the whole test ran past --timeout-s
(never a hang).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
from collections.abc import Callable
from functools import partial

import mlx.core as mx
import numpy as np

from contract.linktest import BandwidthRow, Latency, LinkFigure, LinktestResult, result_line
from serving.distributed import barrier, detect_env, init_group

EXIT_WRONG_SUM = 1
EXIT_TIMEOUT = 3
SIZES = (4 << 10, 64 << 10, 1 << 20, 16 << 20, 64 << 20)


def _timed(build: Callable[[], mx.array]) -> float:
    """Seconds to evaluate the array `build()` returns, after the stream is drained."""
    mx.synchronize()
    started = time.perf_counter()
    mx.eval(build())
    return time.perf_counter() - started


def correctness(group: mx.distributed.Group) -> bool:
    """An exact int32 sum: every rank contributes (i % 1000) * (rank + 1)."""
    size = group.size()
    base = mx.arange(1 << 18, dtype=mx.int32) % 1000
    total = mx.distributed.all_sum(base * (group.rank() + 1), group=group)
    ok = bool(mx.all(total == base * (size * (size + 1) // 2)).item())
    votes = mx.distributed.all_sum(mx.array([0 if ok else 1], dtype=mx.int32), group=group)
    return bool(votes.item() == 0)


def latency(group: mx.distributed.Group, rounds: int) -> Latency:
    one = mx.array([1.0])
    samples = sorted(
        _timed(partial(mx.distributed.all_sum, one, group=group)) for _ in range(rounds)
    )
    return Latency(
        p50_us=statistics.median(samples) * 1e6,
        p99_us=samples[min(len(samples) - 1, int(len(samples) * 0.99))] * 1e6,
    )


def bandwidth(group: mx.distributed.Group, sizes: list[int]) -> list[BandwidthRow]:
    """all_sum of each size: best of a few rounds; bus GB/s as NCCL counts it."""
    n = group.size()
    rows = []
    for nbytes in sizes:
        data = mx.ones(nbytes // 4, dtype=mx.float32)
        mx.eval(data)
        rounds = 5 if nbytes <= (1 << 20) else 2
        best = min(
            _timed(partial(mx.distributed.all_sum, data, group=group)) for _ in range(rounds)
        )
        algbw = nbytes / best / 1e9
        rows.append(BandwidthRow(nbytes, best, algbw, algbw * 2 * (n - 1) / n))
    return rows


def per_link(group: mx.distributed.Group, nbytes: int) -> list[LinkFigure]:
    """Rank i sends nbytes to rank i+1 while the others wait; the receiver times it."""
    n, rank = group.size(), group.rank()
    data = mx.ones(nbytes // 4, dtype=mx.float32)
    mx.eval(data)
    seconds = np.zeros(n, dtype=np.float32)
    for src in range(n):
        dst = (src + 1) % n
        barrier(group)
        if rank == src:
            mx.eval(mx.distributed.send(data, dst, group=group))
        elif rank == dst:
            seconds[src] = _timed(partial(mx.distributed.recv_like, data, src, group=group))
    barrier(group)
    gathered = mx.distributed.all_sum(mx.array(seconds), group=group)
    return [
        LinkFigure(src, (src + 1) % n, nbytes, float(t), nbytes / float(t) / 1e9 if t > 0 else 0.0)
        for src, t in enumerate(np.array(gathered).tolist())
    ]


def run(args: argparse.Namespace) -> int:
    group = init_group(detect_env())
    barrier(group)
    ok = correctness(group)
    result = LinktestResult(
        ranks=group.size(),
        correct=ok,
        latency=latency(group, args.rounds),
        bandwidth=bandwidth(group, args.sizes),
        links=per_link(group, args.link_bytes) if group.size() > 1 else [],
    )
    if group.rank() == 0:
        print(result_line(result), flush=True)
    return 0 if ok else EXIT_WRONG_SUM


def _deadline(seconds: float) -> None:
    """Exit on our own rather than hang in a collective whose peer went silent."""

    def expire() -> None:
        print(f"linktest: not done within {seconds:g} s, exiting", file=sys.stderr, flush=True)
        os._exit(EXIT_TIMEOUT)

    timer = threading.Timer(seconds, expire)
    timer.daemon = True
    timer.start()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m serving.linktest", description=__doc__)
    parser.add_argument("--sizes", type=int, nargs="+", default=list(SIZES))
    parser.add_argument("--rounds", type=int, default=200, help="latency samples")
    parser.add_argument("--link-bytes", type=int, default=8 << 20)
    parser.add_argument("--timeout-s", type=float, default=120.0)
    args = parser.parse_args(argv)
    _deadline(args.timeout_s)
    code = run(args)
    sys.stdout.flush()
    os._exit(code)  # MLX's backend threads must not keep a finished test alive


if __name__ == "__main__":
    main()
