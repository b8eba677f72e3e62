"""Benchmark, in-process: the kernels of one layer's decode attention at a long context.

Where a decode step's attention spends its time on this CPU, float vs quantized KV, part
by part, on random data shaped as SmolLM2's layer (9 query heads, 3 KV heads of 64,
float32, OpenBLAS loaded as a rank loads it): the scores and the values' weighted sum as
float matmuls, as MLX's quantized_matmul in the cache's layout (keys per token:
`transpose=True`; values per token: `transpose=False`), the scores with the keys stored
per channel (KIVI's layout: the history as (dim, tokens) quantized along tokens, the
non-transposed kernel), the values stored that way too, and the softmax both paths share.
Each kernel in turn, `--rounds` rounds of `--calls` calls; the median per call.

    .venv/bin/python bench/kv_kernels.py [--context 7936] [--bits 4 8] [--rounds 3]
        [--calls 200]

Figures: bench/README.md (kv_cache.py's section).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from serving.blas import load_openblas  # noqa: E402  (before mlx.core, as a rank does)

BLAS = load_openblas()

import mlx.core as mx  # noqa: E402

KV_HEADS, REPEATS, DIM, GROUP = 3, 3, 64, 64


def kernels(context: int, bits: int) -> dict[str, Callable[[], mx.array]]:
    """One decode query's attention parts over `context` positions, by name."""
    queries = mx.random.normal((1, KV_HEADS, REPEATS, DIM))
    weights = mx.softmax(mx.random.normal((1, KV_HEADS, REPEATS, context)), axis=-1)
    keys, values = (mx.random.normal((1, KV_HEADS, context, DIM)) for _ in range(2))
    keys_t = mx.contiguous(mx.swapaxes(keys, -1, -2))
    values_t = mx.contiguous(mx.swapaxes(values, -1, -2))
    q = {name: mx.quantize(x, group_size=GROUP, bits=bits) for name, x in
         (("keys", keys), ("values", values), ("keys_t", keys_t), ("values_t", values_t))}
    mx.eval(queries, weights, keys, values, keys_t, q)

    def qmm(x: mx.array, triple: tuple[mx.array, mx.array, mx.array],
            transpose: bool) -> mx.array:
        packed, scales, biases = triple
        return mx.quantized_matmul(x, packed, scales, biases, transpose=transpose,
                                   group_size=GROUP, bits=bits)

    return {
        "scores, float matmul": lambda: queries @ keys_t,
        "values, float matmul": lambda: weights @ values,
        "softmax (both paths)": lambda: mx.softmax(weights * 1.0, axis=-1, precise=True),
        "scores, keys per token (transpose=True; the cache's)":
            lambda: qmm(queries, q["keys"], True),
        "values, per token (transpose=False; the cache's)":
            lambda: qmm(weights, q["values"], False),
        "scores, keys per channel (KIVI; transpose=False)":
            lambda: qmm(queries, q["keys_t"], False),
        "values, per channel (transpose=True)": lambda: qmm(weights, q["values_t"], True),
    }


def per_call_us(kernel: Callable[[], mx.array], calls: int) -> float:
    for _ in range(3):
        mx.eval(kernel())
    start = time.perf_counter()
    for _ in range(calls):
        mx.eval(kernel())
    return (time.perf_counter() - start) / calls * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--context", type=int, default=7936)
    parser.add_argument("--bits", type=int, nargs="+", default=[4, 8])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--calls", type=int, default=200)
    args = parser.parse_args()
    print(f"BLAS {BLAS or 'MLX reference'}; context {args.context}; microseconds per call")
    for bits in args.bits:
        parts = kernels(args.context, bits)
        times: dict[str, list[float]] = {name: [] for name in parts}
        for _ in range(args.rounds):
            for name, kernel in parts.items():
                times[name].append(per_call_us(kernel, args.calls))
        print(f"kv_bits {bits}:")
        for name, samples in times.items():
            print(f"  {statistics.median(samples):8.0f}  {name}")


if __name__ == "__main__":
    main()
