"""One rank of bench/pipeline_micro.py (started by it with MLX_RANK and MLX_HOSTFILE).

Loads its pipeline stage of the model, and for each batch size prefills equal-length
prompts once through the plain pipelined forward, then decodes greedily from copies of
that KV cache in each mode, the modes taking turns within every repetition:
  plain   the pipelined model's own forward (one stage at a time, head on every rank)
  serial  serving/model/pipeline_micro.py with one micro-batch (same order as plain,
          head on rank 0 only, tokens sent to the first stage): the control
  micro   the same with two micro-batches in flight
Rank 0 prints one JSON object: per batch and mode, every repetition's decode tokens/s,
each rank's busy share and compute time per step, and whether its tokens equal plain's.

    python bench/pipeline_micro_rank.py MODEL SPLIT_JSON BATCHES_JSON STEPS REPS
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from serving.blas import load_openblas  # noqa: E402

load_openblas()  # before mlx.core is imported

import mlx.core as mx  # noqa: E402
from mlx_lm.models.cache import make_prompt_cache  # noqa: E402

from serving.model.loading import _load_pipeline  # noqa: E402
from serving.model.pipeline_micro import (  # noqa: E402
    DecodeResult,
    MicroBatchPipeline,
    halves,
    plain_decode,
    split_cache,
)

PROMPT_TOKENS = 48
TEXT = REPO / "docs" / "placement.md"  # real text: the prompts are windows of it


def prompts(tokenizer: Any, batch: int) -> mx.array:
    ids = tokenizer.encode(TEXT.read_text())
    return mx.array([ids[i * 11 : i * 11 + PROMPT_TOKENS] for i in range(batch)])


def run(mode: str, model: Any, micro: MicroBatchPipeline, cache: list[Any], first: mx.array,
        steps: int) -> DecodeResult:
    batch = first.shape[0]
    if mode == "plain":
        return plain_decode(model, split_cache(cache, slice(0, batch)), first, steps)
    parts = halves(batch, 1 if mode == "serial" else 2)
    return micro.decode([split_cache(cache, rows) for rows in parts],
                        [first[rows] for rows in parts], steps)


def main() -> None:
    path, split, batches, steps, reps = sys.argv[1], *map(json.loads, sys.argv[2:6])
    group = mx.distributed.init(strict=True, backend="ring")
    model, tokenizer, _ = _load_pipeline(Path(path), group, split, trust=False)
    micro = MicroBatchPipeline(model, group)
    modes = ["plain", "serial", "micro"]
    report: dict[str, Any] = {"split": split, "steps": steps, "batches": {}}
    for batch in batches:
        cache = make_prompt_cache(model)
        logits = model(prompts(tokenizer, batch), cache=cache)
        first = mx.argmax(logits[:, -1], axis=-1).astype(mx.int32)
        mx.eval(first, [(c.keys, c.values) for c in cache])
        for mode in modes:  # warm-up: MLX compiles nothing, but the first calls allocate
            run(mode, model, micro, cache, first, 4)
        figures: dict[str, list[dict[str, Any]]] = {m: [] for m in modes}
        for rep in range(reps):
            order = modes if rep % 2 == 0 else modes[::-1]
            results = {}
            for mode in order:
                mx.eval(mx.distributed.all_sum(mx.array(1.0), group=group))  # start together
                results[mode] = result = run(mode, model, micro, cache, first, steps)
                times = result.times
                shares = mx.distributed.all_gather(
                    mx.array([[times.busy_share, times.work_s * 1000 / (steps - 1)]]), group=group
                ).tolist()
                staged = mode != "plain"  # plain's forward cannot be timed by stage
                figures[mode].append({
                    "tok_s": batch * (steps - 1) / result.seconds,
                    # rank 0, rank 1, ...
                    "busy_share": [round(r[0], 4) for r in shares] if staged else None,
                    "work_ms_per_step": [round(r[1], 2) for r in shares] if staged else None,
                })
            for mode in modes:
                figures[mode][-1]["equals_plain"] = results[mode].tokens == results["plain"].tokens
        report["batches"][str(batch)] = figures
        if group.rank() == 0:
            print(f"batch {batch}: " + ", ".join(
                f"{m} {[round(f['tok_s'], 1) for f in figures[m]]}" for m in modes),
                file=sys.stderr, flush=True)
    mx.eval(mx.distributed.all_sum(mx.array(1.0), group=group))
    if group.rank() == 0:
        report["sample"] = tokenizer.decode(results["micro"].tokens[0])
        print(json.dumps(report))
    time.sleep(0.2)  # let the peer finish its last collective before the sockets close


if __name__ == "__main__":
    main()
