"""The batched quantized KV cache against mlx-lm's BatchKVCache, operation by operation.

Two references are driven alike: one fed the exact keys and values, one fed them already
quantized and dequantized (what the quantized part stores: each position is quantized on
its own). Every live position of the cache, read back in full precision, must equal one
of the two exactly; the quantized part's positions the rounded one, and every row's
`window` most recent positions the exact one, through merge, chunked prefill, decode,
filter, extend, trim and extract.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import pytest
from mlx_lm.models import base
from mlx_lm.models.base import create_causal_mask
from mlx_lm.models.cache import BatchKVCache, KVCache

from serving.engine.kv_window import Windowed, windowed_attention
from serving.engine.quantized_cache import QuantizedBatchKVCache, SequenceKVCache

HEADS, DIM = 2, 64
WINDOW = 8  # blocks of 8 leave it: 8 to 15 positions exact


def _kv(rows: int, steps: int, seed: int) -> tuple[mx.array, mx.array]:
    mx.random.seed(seed)
    return (mx.random.normal((rows, HEADS, steps, DIM)).astype(mx.float16),
            mx.random.normal((rows, HEADS, steps, DIM)).astype(mx.float16))


def _round(x: mx.array, bits: int) -> mx.array:
    return mx.dequantize(*mx.quantize(x, group_size=64, bits=bits), group_size=64, bits=bits)


class Pair:
    """The quantized cache and the two references, driven alike."""

    def __init__(self, quant: Any, exact: Any, rounded: Any, bits: int) -> None:
        self.quant, self.exact, self.rounded, self.bits = quant, exact, rounded, bits

    def caches(self) -> tuple[Any, Any, Any]:
        return self.quant, self.exact, self.rounded

    def update(self, keys: mx.array, values: mx.array) -> None:
        self.quant.update_and_fetch(keys, values)
        self.exact.update_and_fetch(keys, values)
        self.rounded.update_and_fetch(_round(keys, self.bits), _round(values, self.bits))

    def check(self, window: int = WINDOW) -> None:
        got = self.quant.dequantized()
        live = self.exact.make_mask(1)[:, 0, -1, :-1][:, None, :, None]  # (rows, 1, cols, 1)
        cols = mx.arange(self.quant.size())[None, None, :, None]
        recent = cols >= self.quant.size() - window
        quantized = cols < self.quant._q
        for plain, exact, rounded in zip(got, self.exact.keys_and_values(),
                                         self.rounded.keys_and_values(), strict=True):
            assert plain.shape == exact.shape
            off_exact = (plain != exact) & live
            off_rounded = (plain != rounded) & live
            assert not (off_exact & off_rounded).any().item(), "a value is neither"
            assert not (off_exact & recent).any().item(), "the window is not exact"
            assert not (off_rounded & quantized).any().item(), "a quantized one is off"
        assert self.quant.offset.tolist() == self.exact.offset.tolist()
        assert self.quant.left_padding.tolist() == self.exact.left_padding.tolist()
        assert self.quant.size() == self.exact.size()
        assert mx.array_equal(self.quant.make_mask(3), self.exact.make_mask(3))

    def prepare(self, **kwargs: Any) -> None:
        for cache in self.caches():
            cache.prepare(**kwargs)

    def finalize(self) -> None:
        for cache in self.caches():
            cache.finalize()

    def filter(self, rows: list[int]) -> None:
        for cache in self.caches():
            cache.filter(rows)

    def extend(self, other: Pair) -> None:
        for cache, more in zip(self.caches(), other.caches(), strict=True):
            cache.extend(more)

    def trim(self, n: int) -> None:
        assert {c.trim(n) for c in self.caches()} == {n}


def _sequences(lengths: list[int], bits: int, seed: int, window: int = WINDOW) -> Pair:
    quant, exact, rounded = [], [], []
    for i, n in enumerate(lengths):
        row = QuantizedBatchKVCache([0], group_size=64, bits=bits, window=window)
        e, r = KVCache(), KVCache()
        if n:
            keys, values = _kv(1, n, seed + i)
            row.update_and_fetch(keys, values)
            e.update_and_fetch(keys, values)
            r.update_and_fetch(_round(keys, bits), _round(values, bits))
        quant.append(row.extract(0) if n else SequenceKVCache(64, bits, window))
        exact.append(e)
        rounded.append(r)
    return Pair(SequenceKVCache.merge(quant), BatchKVCache.merge(exact),
                BatchKVCache.merge(rounded), bits)


@pytest.mark.parametrize("bits", [4, 8])
def test_merge_prefill_and_decode_keep_the_window_exact(bits: int) -> None:
    """Merging cached sequences, a right-padded prefill chunk and decode steps: the
    window exact, everything older quantized."""
    pair = _sequences([20, 0, 9], bits, seed=1)
    assert isinstance(pair.quant, QuantizedBatchKVCache)
    pair.check()
    pair.prepare(lengths=[3, 1, 2], right_padding=[0, 2, 1])
    pair.update(*_kv(3, 3, seed=7))
    pair.finalize()
    pair.check()
    for step in range(300):  # past a 256-position block: the quantized part grows
        pair.update(*_kv(3, 1, seed=100 + step))
        if step % 37 == 0:
            pair.check()
    assert pair.quant._q > 256
    pair.check()


def test_a_long_right_padded_prompt_rolls_across_the_boundary() -> None:
    """Chunks longer than the window with right padding: finalize moves each row's
    padding left across the quantized/exact boundary."""
    pair = _sequences([0, 0], 4, seed=20)
    pair.prepare(left_padding=[0, 0])
    pair.prepare(lengths=[40, 35], right_padding=[0, 5])
    for chunk in range(4):
        pair.update(*_kv(2, 10, seed=21 + chunk))
    pair.finalize()
    assert pair.quant._q > 0
    pair.check()
    pair.update(*_kv(2, 1, seed=30))
    pair.check()


def test_filter_and_extend_across_batch_changes() -> None:
    """Sequences leaving (filter) and joining (extend) keep every row's KV in place."""
    pair = _sequences([4, 30], 8, seed=2)
    pair.update(*_kv(2, 1, seed=3))
    pair.filter([0])  # the shorter row stays: the padding every row shares goes
    assert pair.quant.size() == 5
    pair.check()
    other = _sequences([40, 3], 8, seed=4)
    pair.extend(other)
    pair.check()
    pair.update(*_kv(3, 1, seed=5))
    pair.check()
    pair.extend(_sequences([0], 8, seed=6))  # a fresh sequence joining a running batch
    pair.check()
    pair.filter([1, 2])
    pair.check()


def test_trim_takes_back_speculated_positions() -> None:
    """trim(n) forgets the last n positions, as speculation's rejected drafts need; drafts
    fed at once leave the window whole after the trim."""
    pair = _sequences([30, 2], 4, seed=8)
    for step in range(7):  # the window one short of handing a block over
        pair.update(*_kv(2, 1, seed=40 + step))
    pair.update(*_kv(2, 4, seed=9))  # drafts: a block leaves, what a trim may take stays
    pair.trim(3)
    pair.check()
    pair.update(*_kv(2, 1, seed=10))
    pair.check()
    pair.trim(20)  # into the quantized part
    pair.check(window=0)
    pair.update(*_kv(2, 1, seed=11))
    pair.check(window=1)


@pytest.mark.parametrize("bits", [4, 8])
def test_extract_and_state_round_trip_for_the_prefix_cache(bits: int) -> None:
    """A row extracted, stored by state, trimmed and merged back is what was there."""
    pair = _sequences([3, 30], bits, seed=11)
    pair.update(*_kv(2, 2, seed=12))
    row = pair.quant.extract(1)
    assert row.size() == pair.exact.extract(1).offset == 32
    stored = SequenceKVCache.from_state(row.state)
    stored.meta_state = row.meta_state
    assert (stored.bits, stored.group_size, stored.size(), stored.nbytes) == (
        bits, 64, 32, row.nbytes)
    again = SequenceKVCache.merge([stored])
    for got, want in zip(again.dequantized(), pair.quant.dequantized(), strict=True):
        assert mx.array_equal(got[0], want[1])
    stored.trim(20)  # the prefix cache reusing a shorter prefix
    shorter = SequenceKVCache.merge([stored])
    for got, want in zip(shorter.dequantized(), pair.quant.dequantized(), strict=True):
        assert mx.array_equal(got[0], want[1, :, :12])
    batch = QuantizedBatchKVCache.from_state(pair.quant.state)
    batch.meta_state = pair.quant.meta_state
    assert (batch.bits, batch.size(), batch.nbytes) == (bits, pair.quant.size(),
                                                        pair.quant.nbytes)


@pytest.mark.parametrize("window", [0, WINDOW])
def test_decode_attention_over_both_parts_matches_attention_over_their_values(
        window: int) -> None:
    """A decode step reads [quantized ; exact window] (grouped heads, padded rows) as
    attention over the same values in full precision would."""
    pair = _sequences([20, 40], 8, seed=13, window=window)
    queries = mx.random.normal((2, 2 * HEADS, 1, DIM)).astype(mx.float16)
    mask = pair.quant.make_mask(1)  # as a model does, then the layer stores this step's KV
    keys, values = pair.quant.update_and_fetch(*_kv(2, 1, seed=15))
    assert pair.quant.bits == 8 and keys[0].dtype == mx.uint32
    assert hasattr(keys, "exact") == bool(window)
    got = base.scaled_dot_product_attention(  # as mlx-lm's models call it
        mx.array(queries), keys, values, cache=pair.quant, scale=DIM**-0.5, mask=mask)
    want = mx.fast.scaled_dot_product_attention(
        queries, *pair.quant.dequantized(), scale=DIM**-0.5, mask=mask)
    assert mx.allclose(got, want, atol=4e-3).item()  # float16's rounding


def test_4_bit_cache_holds_under_a_third_of_16_bit_kv() -> None:
    """The memory win: 4 bits plus a scale and bias per 64 values, against float16, with
    the window's 16 positions in float16 beside 512 quantized."""
    pair = _sequences([512], 4, seed=14)
    sixteen = 2 * 512 * HEADS * DIM * 2
    assert pair.quant.nbytes <= sixteen * 0.31


def test_a_chunk_attends_exactly_a_decode_step_through_the_quantized_part() -> None:
    """A prompt chunk gets the history in full precision (no `bits`: the model's float
    attention); a single position gets the packed part once one exists."""
    pair = _sequences([4], 8, seed=16, window=0)
    keys, values = _kv(1, 3, seed=17)
    got_k, got_v = pair.quant.update_and_fetch(keys, values)
    assert not hasattr(pair.quant, "bits")
    assert mx.array_equal(got_k[..., 4:, :], keys) and mx.array_equal(got_v[..., 4:, :], values)
    assert mx.array_equal(got_k[..., :4, :], _round(pair.exact.keys_and_values()[0][..., :4, :], 8))
    windowed = _sequences([4], 8, seed=16)
    packed, _ = windowed.quant.update_and_fetch(*_kv(1, 1, seed=18))
    assert not hasattr(windowed.quant, "bits") and packed.dtype == mx.float16  # all exact


@pytest.mark.parametrize("mask_kind", ["padded", "per_head", "causal"])
def test_windowed_attention_of_several_queries_matches_float_attention(mask_kind: str) -> None:
    """Several positions at once (grouped heads as rows) attend as float attention over
    the dequantized history and the window does, whatever shape the mask has."""
    rows, length, quantized, exact, repeats = 2, 3, 128, 8, 3
    mx.random.seed(19)
    q = mx.random.normal((rows, HEADS * repeats, length, DIM))
    k, v = (mx.random.normal((rows, HEADS, quantized + exact, DIM)) for _ in range(2))
    packed = [mx.quantize(x[..., :quantized, :], group_size=64, bits=4) for x in (k, v)]
    keys, values = (Windowed(p, x[..., quantized:, :]) for p, x in zip(packed, (k, v),
                                                                        strict=True))
    plain = [mx.concatenate([mx.dequantize(*p, group_size=64, bits=4), x[..., quantized:, :]],
                            axis=2) for p, x in zip(packed, (k, v), strict=True)]
    total = quantized + exact
    causal = mx.arange(total - length, total)[:, None] >= mx.arange(total)[None]
    padded = create_causal_mask(length, total - length, left_padding=mx.array([0, 5]))
    mask: Any = {"padded": padded,
                 "per_head": mx.broadcast_to(causal, (rows, HEADS * repeats, length, total))
                 & (mx.random.uniform(shape=(rows, HEADS * repeats, 1, total)) > 0.3),
                 "causal": "causal"}[mask_kind]
    got = windowed_attention(q, keys, values, DIM**-0.5, mask, 64, 4)
    want = mx.fast.scaled_dot_product_attention(q, *plain, scale=DIM**-0.5, mask=mask)
    assert mx.allclose(got, want, atol=1e-4).item()


def test_a_decode_step_after_a_trim_into_the_quantized_part_reads_only_live_columns() -> None:
    """After trim takes back quantized positions, the next decode step's attention reads
    the quantized columns still live, not the wider array they were cut from."""
    pair = _sequences([30, 2], 8, seed=22)
    pair.trim(20)  # into the quantized part: it is now narrower than its arrays
    queries = mx.random.normal((2, 2 * HEADS, 1, DIM)).astype(mx.float16)
    mask = pair.quant.make_mask(1)
    keys, values = pair.quant.update_and_fetch(*_kv(2, 1, seed=23))
    assert keys[0].shape[2] + keys.exact.shape[2] == pair.quant.size()
    got = base.scaled_dot_product_attention(
        queries, keys, values, cache=pair.quant, scale=DIM**-0.5, mask=mask)
    want = mx.fast.scaled_dot_product_attention(
        queries, *pair.quant.dequantized(), scale=DIM**-0.5, mask=mask)
    assert mx.allclose(got, want, atol=4e-3).item()
