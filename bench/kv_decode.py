"""Benchmark, in-process (no ranks): decode steps at a long context, quantized KV vs not.

The bundled SmolLM2 (float32, OpenBLAS loaded as a rank loads it), one sequence whose
cache holds `--context` positions (random keys and values: the speed does not depend on
them), then decode steps through the model with mlx-lm's BatchKVCache (what a rank
batches with unquantized) and with our QuantizedBatchKVCache (`kv_bits` 4 and 8, groups
of 64, window 64). Per round each cache in turn runs `--steps` steps (then trims them
back: the context stays fixed); medians of `--rounds`. `--attention` times one layer's
attention alone (30 calls per figure: the model's 30 layers) on the same caches: float
SDPA over the unquantized cache vs serving/engine/kv_window.py's windowed attention.

    .venv/bin/python bench/kv_decode.py [--context 8000] [--steps 6]
        [--rounds 3] [--attention]

Figures: bench/README.md (kv_cache.py's section).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from serving.blas import load_openblas  # noqa: E402  (before mlx.core, as a rank does)

BLAS = load_openblas()

import mlx.core as mx  # noqa: E402
from mlx_lm.models import base  # noqa: E402
from mlx_lm.models.cache import BatchKVCache  # noqa: E402
from mlx_lm.utils import load_model  # noqa: E402

from contract.settings import ModelSettings, RankSettings  # noqa: E402
from serving.engine.quantized_cache import QuantizedBatchKVCache  # noqa: E402
from serving.model.loading import resolve  # noqa: E402

KINDS = ("none", "4", "8")


def caches(kind: str, kv: list[tuple[mx.array, mx.array]]) -> list[Any]:
    """One layer cache per (keys, values), holding them (`kind`: none, or kv_bits)."""
    out = []
    for keys, values in kv:
        cache = (BatchKVCache([0]) if kind == "none"
                 else QuantizedBatchKVCache([0], 64, int(kind), 64))
        cache.update_and_fetch(keys, values)
        out.append(cache)
    mx.eval([c.state for c in out])
    return out


def model_steps(model: Any, layer_caches: list[Any], steps: int) -> float:
    """Decode tokens per second over `steps` steps; the cache trimmed back after."""
    token = mx.array([[42]])
    start = time.perf_counter()
    for _ in range(steps):
        mx.eval(model(token, cache=layer_caches))
    elapsed = time.perf_counter() - start
    for cache in layer_caches:
        cache.trim(steps)
    return steps / elapsed


def attention_calls(layer_caches: list[Any], heads: int, kv_heads: int) -> float:
    """Calls per second of one layer's decode attention, as mlx-lm's models call it."""
    cache = layer_caches[0]
    dim = 64
    queries = mx.random.normal((1, heads, 1, dim))
    new = mx.random.normal((1, kv_heads, 1, dim))
    mask = cache.make_mask(1)
    keys, values = cache.update_and_fetch(new, new)
    start = time.perf_counter()
    mx.eval([base.scaled_dot_product_attention(queries, keys, values, cache=cache,
                                               scale=dim**-0.5, mask=mask)
             for _ in range(30)])
    elapsed = time.perf_counter() - start
    cache.trim(1)
    return 30 / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--context", type=int, default=8000)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--attention", action="store_true")
    args = parser.parse_args()
    path = resolve(RankSettings(model=ModelSettings(path="bundled:smollm2-135m-instruct")),
                   float32=BLAS is not None)
    model, config = load_model(path)
    mx.eval(model.parameters())
    kv_heads, heads = config["num_key_value_heads"], config["num_attention_heads"]
    mx.random.seed(0)
    kv = [(mx.random.normal((1, kv_heads, args.context, 64)),
           mx.random.normal((1, kv_heads, args.context, 64))) for _ in model.layers]
    built = {kind: caches(kind, kv) for kind in KINDS}

    def measure(kind: str) -> float:
        if args.attention:
            return attention_calls(built[kind], heads, kv_heads)
        return model_steps(model, built[kind], args.steps)

    for kind in KINDS:
        measure(kind)  # warm
    rates: dict[str, list[float]] = {kind: [] for kind in KINDS}
    for _ in range(args.rounds):
        for kind in KINDS:
            rates[kind].append(measure(kind))
    base_rate = statistics.median(rates["none"])
    unit = "layer attentions/s" if args.attention else "tok/s"
    print(f"BLAS {BLAS}; context {args.context}")
    for kind in KINDS:
        rate = statistics.median(rates[kind])
        print(f"kv_bits {kind:>4}: {rate:8.2f} {unit} (rounds "
              f"{[round(x, 2) for x in rates[kind]]}), x{rate / base_rate:.2f} unquantized")


if __name__ == "__main__":
    main()
