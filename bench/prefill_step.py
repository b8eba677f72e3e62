"""Benchmark: what a prompt chunk adds to a decode step, apart and fused (1 rank).

mlx-lm's BatchGenerator runs a step's prefill chunk as a forward of its own after the
decode forward. This measures, on the bundled model (float32 with OpenBLAS on Linux, as
the ranks serve it), the time of:

  decode     the decode forward of `--rows` sequences alone
  separate   that, then a `chunk`-token forward of one prompt `context` tokens in (what
             serving does today)
  fused      both in one forward: embeddings, projections and MLP over all rows at
             once, attention per sequence against its own cache (a prototype for
             llama-style models, to size what fusing inside BatchGenerator would give)

interleaved round by round so the machine's noise hits every mode alike, and MLX's CPU
`exp` against `power(2, x)` on a softmax-sized block (most of a long prompt's attention).
Figures go to bench/results/prefill-step-<timestamp>.json and a table is printed.

    .venv/bin/python bench/prefill_step.py [--contexts 100 2000] [--chunks 4 8 16 32]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from serving.blas import load_openblas  # noqa: E402  (before MLX: it binds MLX's BLAS)

load_openblas()

import mlx.core as mx  # noqa: E402
from mlx_lm import load  # noqa: E402
from mlx_lm.models.base import create_attention_mask, scaled_dot_product_attention  # noqa: E402
from mlx_lm.models.cache import make_prompt_cache  # noqa: E402
from results_file import results_path  # noqa: E402

from serving.model.bundled import resolve_model  # noqa: E402

VOCAB_SAMPLE = 1000  # token ids drawn below this: any real tokens do
DECODE_CONTEXT = 100  # tokens each decoding row already holds
SOFTMAX_BLOCK = 9 * 16 * 2000  # a layer's scores: SmolLM2's 9 heads, 16-token chunk, 2,000 in


class StepBench:
    def __init__(self, model: Any, rows: int, context: int) -> None:
        self.model, self.rows = model, rows
        self.decode_cache = self._filled(rows, DECODE_CONTEXT)
        self.prompt_cache = self._filled(1, context)

    def _filled(self, rows: int, tokens: int) -> list[Any]:
        cache = make_prompt_cache(self.model)
        for start in range(0, tokens, 512):
            self.model(_tokens(rows, min(512, tokens - start)), cache=cache)
            mx.eval([c.state for c in cache])
        return cache

    def _rewind(self, chunk: int) -> None:
        """Back to where the step started, so every step sees the same context."""
        for c in self.decode_cache:
            c.trim(1)
        for c in self.prompt_cache if chunk else ():
            c.trim(chunk)

    def decode(self) -> None:
        mx.eval(self.model(_tokens(self.rows, 1), cache=self.decode_cache)[:, -1])
        self._rewind(0)

    def separate(self, chunk: int) -> None:
        logits = self.model(_tokens(self.rows, 1), cache=self.decode_cache)[:, -1]
        mx.async_eval(logits)  # as BatchGenerator does: the chunk's forward follows
        self.model(_tokens(1, chunk), cache=self.prompt_cache)
        mx.eval(logits, [c.state for c in self.prompt_cache])
        self._rewind(chunk)

    def fused(self, chunk: int) -> None:
        inner, rows = self.model.model, self.rows
        prompt_h = inner.embed_tokens(_tokens(1, chunk))
        prompt_mask = create_attention_mask(prompt_h, self.prompt_cache[0])
        h = mx.concatenate(
            [inner.embed_tokens(_tokens(rows, 1)).reshape(rows, -1), prompt_h[0]]
        )[None]
        for layer, dc, pc in zip(inner.layers, self.decode_cache, self.prompt_cache,
                                 strict=True):
            attn = layer.self_attn
            x = layer.input_layernorm(h)
            q, k, v = attn.q_proj(x)[0], attn.k_proj(x)[0], attn.v_proj(x)[0]
            outputs = []
            for part, cache, mask in ((slice(0, rows), dc, None),
                                      (slice(rows, None), pc, prompt_mask)):
                n = rows if cache is dc else 1
                qs, ks, vs = (
                    t[part].reshape(n, -1, heads, attn.head_dim).transpose(0, 2, 1, 3)
                    for t, heads in ((q, attn.n_heads), (k, attn.n_kv_heads),
                                     (v, attn.n_kv_heads))
                )
                qs, ks = attn.rope(qs, offset=cache.offset), attn.rope(ks, offset=cache.offset)
                ks, vs = cache.update_and_fetch(ks, vs)
                out = scaled_dot_product_attention(qs, ks, vs, cache=cache,
                                                   scale=attn.scale, mask=mask)
                outputs.append(out.transpose(0, 2, 1, 3).reshape(-1, out.shape[1] * out.shape[3]))
            h = h + attn.o_proj(mx.concatenate(outputs)[None])
            h = h + layer.mlp(layer.post_attention_layernorm(h))
        last = inner.norm(mx.concatenate([h[:, :rows], h[:, -1:]], axis=1))
        logits = (self.model.lm_head(last) if hasattr(self.model, "lm_head")
                  else inner.embed_tokens.as_linear(last))
        mx.eval(logits, [c.state for c in self.prompt_cache])
        self._rewind(chunk)


def _tokens(rows: int, length: int) -> mx.array:
    return mx.random.randint(0, VOCAB_SAMPLE, (rows, length))


def median_ms(calls: list[Callable[[], None]], steps: int) -> list[float]:
    """Each call's median time; the calls take turns, step by step."""
    times: list[list[float]] = [[] for _ in calls]
    for call in calls:
        call()  # warm-up
    for _ in range(steps):
        for index, call in enumerate(calls):
            start = time.perf_counter()
            call()
            times[index].append(time.perf_counter() - start)
    return [statistics.median(t) * 1e3 for t in times]


def exp_vs_power(elements: int, steps: int) -> dict[str, float]:
    scores = mx.random.normal((elements,))
    exp_ms, power_ms = median_ms(
        [lambda: mx.eval(mx.exp(scores)), lambda: mx.eval(mx.power(2.0, scores))], steps
    )
    return {"elements": elements, "exp_ns_per_element": exp_ms * 1e6 / elements,
            "power2_ns_per_element": power_ms * 1e6 / elements}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="bundled:smollm2-135m-instruct")
    parser.add_argument("--rows", type=int, default=4)
    parser.add_argument("--contexts", type=int, nargs="+", default=[100, 2000])
    parser.add_argument("--chunks", type=int, nargs="+", default=[4, 8, 16, 32])
    parser.add_argument("--steps", type=int, default=30)
    args = parser.parse_args()

    model, _ = load(str(resolve_model(args.model, float32=mx.default_device() == mx.cpu)))
    rows = []
    for context in args.contexts:
        bench = StepBench(model, args.rows, context)
        calls: list[Callable[[], None]] = [bench.decode]
        for chunk in args.chunks:
            calls += [partial(bench.separate, chunk), partial(bench.fused, chunk)]
        decode_ms, *chunked = median_ms(calls, args.steps)
        for index, chunk in enumerate(args.chunks):
            separate_ms, fused_ms = chunked[2 * index], chunked[2 * index + 1]
            rows.append({"context": context, "chunk": chunk, "decode_ms": decode_ms,
                         "separate_ms": separate_ms, "fused_ms": fused_ms})
            print(f"context {context:5d}  chunk {chunk:3d}  decode {decode_ms:6.1f} ms  "
                  f"separate {separate_ms:6.1f} ms ({separate_ms / decode_ms:.2f}x)  "
                  f"fused {fused_ms:6.1f} ms ({fused_ms / decode_ms:.2f}x)")
    exp = exp_vs_power(SOFTMAX_BLOCK, args.steps)
    print(f"exp {exp['exp_ns_per_element']:.1f} ns/element, "
          f"power(2, x) {exp['power2_ns_per_element']:.1f} ns/element")
    out = results_path("prefill-step")
    out.write_text(json.dumps({"model": args.model, "rows": args.rows, "steps": args.steps,
                               "device": str(mx.default_device()), "steps_ms": rows,
                               "exp": exp}, indent=2))
    print(f"figures: {out.relative_to(REPO)}")


if __name__ == "__main__":
    main()
