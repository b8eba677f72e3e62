"""Benchmark (in-process, no ranks): which quantized-KV policy keeps the bundled model's
perplexity within issue 41's targets, before building one into the serving cache.

Plain mlx-lm reads the GPL-3 text in chunks of 256 with its llama attention replaced by
one that attends to keys and values quantized and dequantized (mlx's own mx.quantize /
mx.dequantize: the numbers quantized attention computes with), every query over its
whole history quantized as a decode step is, except for the positions a policy keeps
exact: the first `sinks` tokens (attention sinks) and the `window` most recent ones
(KIVI's residual window). Figures in bench/README.md.

    .venv/bin/python bench/kv_policy_sim.py 1024 none bits=8,group=64 bits=4,group=32,window=64
"""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from serving.blas import load_openblas  # noqa: E402

load_openblas()  # before mlx is imported: float32 matmuls through OpenBLAS

import mlx.core as mx  # noqa: E402
import mlx_lm  # noqa: E402
from mlx_lm.models import llama  # noqa: E402
from mlx_lm.models.cache import KVCache  # noqa: E402

from contract.blas import find_openblas  # noqa: E402
from contract.settings import ModelSettings, RankSettings  # noqa: E402
from serving.model.loading import resolve  # noqa: E402

POLICY: dict[str, int] = {}  # bits, group, sinks, window: the configuration measured


def _fake_quant(x: mx.array, bits: int, group: int) -> mx.array:
    packed = mx.quantize(x, group_size=group, bits=bits)
    return mx.dequantize(*packed, group_size=group, bits=bits)


def attention(q: mx.array, k: mx.array, v: mx.array, cache: Any, scale: float,
              mask: Any, sinks: Any = None) -> mx.array:
    """Causal attention, the keys and values outside the policy's exact set quantized."""
    batch, heads, length, dim = q.shape
    kv_heads, keys = k.shape[1], k.shape[2]
    qpos, kpos = mx.arange(keys - length, keys)[:, None], mx.arange(keys)[None]
    causal = qpos >= kpos
    q = q.reshape(batch, kv_heads, heads // kv_heads, length, dim) * scale
    ke, ve = k[:, :, None], v[:, :, None]
    scores = q @ ke.swapaxes(-1, -2)
    bits = POLICY.get("bits")
    if bits:
        group = POLICY["group"]
        exact = (kpos < POLICY.get("sinks", 0)) | ((qpos - kpos) < POLICY.get("window", 0))
        kq = _fake_quant(k, bits, group)[:, :, None]
        scores = mx.where(exact, scores, q @ kq.swapaxes(-1, -2))
    probs = mx.softmax(mx.where(causal, scores, -1e30), axis=-1, precise=True)
    if not bits:
        return (probs @ ve).reshape(batch, heads, length, dim)
    vq = _fake_quant(v, bits, POLICY["group"])[:, :, None]
    out = mx.where(exact, probs, 0) @ ve + mx.where(exact, 0, probs) @ vq
    return out.reshape(batch, heads, length, dim)


def perplexity(model: Any, ids: list[int], chunk: int = 256) -> float:
    cache = [KVCache() for _ in model.layers]
    nll, count = 0.0, 0
    for start in range(0, len(ids) - 1, chunk):
        x, y = ids[start : start + chunk], ids[start + 1 : start + chunk + 1]
        logits = model(mx.array([x[: len(y)]]), cache=cache)[0].astype(mx.float32)
        logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        nll -= float(logprobs[mx.arange(len(y)), mx.array(y)].sum())
        count += len(y)
    return math.exp(nll / count)


def main() -> None:
    tokens, specs = int(sys.argv[1]), sys.argv[2:] or ["none", "bits=8,group=64"]
    settings = RankSettings(model=ModelSettings(path="bundled:smollm2-135m-instruct"))
    model, tokenizer = mlx_lm.load(str(resolve(settings, float32=find_openblas() is not None)))[:2]
    llama.scaled_dot_product_attention = attention  # type: ignore[assignment]
    text = Path("/usr/share/common-licenses/GPL-3").read_text()
    ids = list(tokenizer.encode(text))[: tokens + 1]
    base = None
    for spec in specs:
        POLICY.clear()
        if spec != "none":
            POLICY.update({k: int(v) for k, v in (kv.split("=") for kv in spec.split(","))})
        tic = time.perf_counter()
        ppl = perplexity(model, ids)
        base = base or ppl
        print(f"{spec:32s} perplexity {ppl:.4f} ({ppl / base - 1:+.2%}) "
              f"in {time.perf_counter() - tic:.0f} s", flush=True)


if __name__ == "__main__":
    main()
