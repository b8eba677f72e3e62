"""The exact window of a quantized KV cache: column helpers, and attention over both parts.

A quantized layer cache keeps its columns (token positions) in two parts: the older ones
quantized (mx.quantize's (packed, scales, biases) triples), the most recent ones exact, in
the activations' dtype (KIVI's residual window). At 4 bits a token attending to its
neighbours' quantized keys is what costs the quality (bench/README.md, kv_policy_sim.py:
+9% to +42% perplexity without the window, unquantized level with 64 tokens kept exact).

A decode step's keys and values reach the model's attention as `Windowed` triples: the
quantized part, with the exact part attached. mlx-lm's models call
`mlx_lm.models.base.quantized_scaled_dot_product_attention` (through base's
scaled_dot_product_attention, when the cache has `bits`); `install()` wraps that function
once so that a Windowed triple is read in two parts: scores from quantized_matmul over the
quantized history and a plain matmul over the exact window, concatenated under one
softmax, then the weighted sum of both parts. Nothing is dequantized per step. Any other
triple goes to mlx-lm's function unchanged.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
from mlx_lm.models import base

Triple = tuple[mx.array, mx.array, mx.array]  # mx.quantize's (packed, scales, biases)


class Windowed(tuple):
    """A quantized (packed, scales, biases) triple with the exact window's columns after it."""

    exact: mx.array

    def __new__(cls, triple: Triple, exact: mx.array) -> Windowed:
        made = super().__new__(cls, triple)
        made.exact = exact
        return made


def windowed_attention(queries: mx.array, q_keys: Windowed, q_values: Windowed,
                       scale: float, mask: Any, group_size: int, bits: int) -> mx.array:
    """Attention over [quantized history ; exact window], one softmax over both (the mask
    spans both parts' columns, in order).

    The query heads sharing a kv head are rows of one matrix, (batch, kv_heads, repeats x
    length, dim), against that kv head's history as it is stored. mlx-lm's own quantized
    attention adds a broadcast axis to the history instead, and quantized_matmul then
    broadcasts it to the queries' batch shape and copies it contiguous (mlx ops.cpp,
    broadcast_arrays; the CPU kernel's ensure_row_contiguous): `repeats` copies of the
    packed history per layer per step, 25-30% of the decode step's attention at 8,000
    tokens on CPU (bench/README.md, kv_cache.py)."""
    batch, q_heads, length, dim = queries.shape
    kv_heads = q_keys[0].shape[-3]
    repeats = q_heads // kv_heads
    rows = repeats * length
    queries = mx.reshape(queries * scale, (batch, kv_heads, rows, dim))
    history = mx.quantized_matmul(queries, q_keys[0], q_keys[1], q_keys[2], transpose=True,
                                  group_size=group_size, bits=bits)
    scores = mx.concatenate([history, queries @ mx.swapaxes(q_keys.exact, -1, -2)], axis=-1)
    if mask is not None:
        scores = _masked(scores, _as_rows(mask, length, repeats, scores.shape[-1]))
    scores = mx.softmax(scores, axis=-1, precise=True)
    split = history.shape[-1]
    out = mx.quantized_matmul(scores[..., :split], q_values[0], q_values[1], q_values[2],
                              transpose=False, group_size=group_size, bits=bits)
    out = out + scores[..., split:] @ q_values.exact
    return mx.reshape(out, (batch, q_heads, length, dim))


def _as_rows(mask: Any, length: int, repeats: int, total: int) -> mx.array:
    """A mask over (batch, 1 or q_heads, length, total) as the rows layout's: row r x
    length + i is query i of the r-th head sharing a kv head."""
    if isinstance(mask, str):  # "causal": the last `length` columns are the queries'
        mask = mx.arange(total - length, total)[:, None] >= mx.arange(total)[None]
    if mask.ndim < 4:
        mask = mx.reshape(mask, (1,) * (4 - mask.ndim) + mask.shape)
    if repeats == 1 or (mask.shape[-2] == 1 and mask.shape[1] == 1):
        return mask  # one row (a decode step's) broadcasts over the heads sharing a kv head
    if mask.shape[1] == 1:
        return mx.tile(mask, (1, 1, repeats, 1))
    b, heads = mask.shape[:2]
    return mx.reshape(mask, (b, heads // repeats, repeats * length, total))


def _masked(scores: mx.array, mask: mx.array) -> mx.array:
    if mask.dtype == mx.bool_:
        return mx.where(mask, scores, mx.finfo(scores.dtype).min)
    return scores + mask


_ORIGINAL = base.quantized_scaled_dot_product_attention


def _dispatch(queries: mx.array, q_keys: Any, q_values: Any, scale: float, mask: Any,
              group_size: int = 64, bits: int = 8) -> mx.array:
    if isinstance(q_keys, Windowed):
        return windowed_attention(queries, q_keys, q_values, scale, mask, group_size, bits)
    return _ORIGINAL(queries, q_keys, q_values, scale=scale, mask=mask,
                     group_size=group_size, bits=bits)


def install() -> None:
    """Route mlx-lm's quantized attention through `_dispatch` (idempotent)."""
    base.quantized_scaled_dot_product_attention = _dispatch


# -- columns (axis 2) of triples and exact arrays -------------------------------------------
def cols(triple: Triple, start: int, end: int | None = None) -> Triple:
    a, b, c = triple
    return a[..., start:end, :], b[..., start:end, :], c[..., start:end, :]


def upto(triple: Triple, end: int) -> Triple:
    """The first `end` columns: the arrays themselves when they hold no more (a slice
    would be a strided view, which quantized_matmul copies)."""
    return triple if triple[0].shape[2] == end else cols(triple, 0, end)


def cat(parts: list[Triple]) -> Triple:
    return triple_of([mx.concatenate([p[i] for p in parts], axis=2) for i in range(3)])


def quantize(x: mx.array, group_size: int, bits: int) -> Triple:
    return mx.quantize(x, group_size=group_size, bits=bits)


def dequantize(triple: Triple, group_size: int, bits: int) -> mx.array:
    return mx.dequantize(*triple, group_size=group_size, bits=bits)


def blank_triple(rows: int, heads: int, length: int, dim: int, dtype: mx.Dtype,
                 group_size: int, bits: int) -> Triple:
    """Zeroed packed columns (they dequantize to zeros: scale and bias 0)."""
    shape = (rows, heads, length)
    return (mx.zeros((*shape, dim * bits // 32), dtype=mx.uint32),
            mx.zeros((*shape, dim // group_size), dtype=dtype),
            mx.zeros((*shape, dim // group_size), dtype=dtype))


def packed_dim(triple: Triple, bits: int) -> int:
    """The unpacked size of a triple's last axis."""
    return triple[0].shape[-1] * 32 // bits


def side_shape(triple: Triple | None, exact: mx.array | None,
               bits: int) -> tuple[int, int, mx.Dtype] | None:
    """(heads, head size, dtype) of one side (keys or values), from whichever part has data."""
    if exact is not None:
        return exact.shape[1], exact.shape[3], exact.dtype
    if triple is not None:
        return triple[0].shape[1], packed_dim(triple, bits), triple[1].dtype
    return None


def rebalance(triple: Triple | None, exact: mx.array | None, rows: int, total: int,
              target: int, shape: tuple[int, int, mx.Dtype], group_size: int,
              bits: int) -> tuple[Triple, mx.array]:
    """One side of a cache's rows (the quantized columns `triple`, then the exact ones),
    right-justified into `total` columns whose last `target` are exact: exact columns
    beyond the target are quantized; short of it, the quantized tail is dequantized into
    the exact part (values that were quantized stay what they were, up to rounding);
    zero columns pad the left (a row's padding, masked)."""
    heads, dim, dtype = shape
    q = triple[0].shape[2] if triple is not None else 0
    e = exact.shape[2] if exact is not None else 0
    if target > e and q:
        k = min(target - e, q)
        moved = dequantize(cols(triple, q - k), group_size, bits)  # type: ignore[arg-type]
        exact = moved if exact is None else mx.concatenate([moved, exact], axis=2)
        triple = cols(triple, 0, q - k)  # type: ignore[arg-type]
        q, e = q - k, e + k
    elif target < e:
        assert exact is not None
        head = quantize(exact[..., : e - target, :], group_size, bits)
        triple = head if triple is None else cat([triple, head])
        exact = exact[..., e - target :, :]
        q, e = q + e - target, target
    pad_e = mx.zeros((rows, heads, target - e, dim), dtype=dtype)
    exact = pad_e if exact is None else mx.concatenate([pad_e, exact], axis=2)
    pad_q = blank_triple(rows, heads, total - target - q, dim, dtype, group_size, bits)
    return (pad_q if triple is None else cat([pad_q, triple])), exact


def cat_rows(parts: list[Triple]) -> Triple:
    return triple_of([mx.concatenate([p[i] for p in parts]) for i in range(3)])


def triple_of(arrays: list[mx.array]) -> Triple:
    a, b, c = arrays
    return a, b, c


def window_target(window: int, total: int, parts: list[tuple[int, int]]) -> int:
    """How many of `total` columns stay exact when caches of (quantized, exact) columns
    join: the narrowest exact part among those with a quantized one, but at least the
    window (all of it when nothing is quantized). A wider part quantizes its surplus; a
    narrower one (trimmed below its window) gets its quantized tail dequantized, which a
    later flush quantizes again (a second rounding of those few values). Never the
    widest: one part short of its window would dequantize every other's."""
    narrowest = [e for q, e in parts if q]
    if not narrowest:
        return max(e for _, e in parts)
    return max(min(window, total), min(narrowest))


def room(exact: mx.array | None, used: int, room: int, like: mx.array) -> mx.array:
    """An exact buffer of `room` columns (or `used`, if more) holding exact[..., :used, :]
    first."""
    rows, heads, _, dim = like.shape
    fresh = mx.zeros((rows, heads, max(room, used), dim), dtype=like.dtype)
    if exact is not None and used:
        fresh[..., :used, :] = exact[..., :used, :]
    return fresh
