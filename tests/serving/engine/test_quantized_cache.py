"""The batched quantized KV cache against mlx-lm's BatchKVCache, operation by operation.

The reference is fed each position already quantized and dequantized, which is what the
quantized cache stores (each position is quantized on its own), so the two must agree
exactly through merge, chunked prefill, decode, filter, extend, trim and extract.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import pytest
from mlx_lm.models.base import quantized_scaled_dot_product_attention
from mlx_lm.models.cache import BatchKVCache, KVCache

from serving.engine.quantized_cache import QuantizedBatchKVCache, SequenceKVCache

HEADS, DIM = 2, 64


def _kv(rows: int, steps: int, seed: int) -> tuple[mx.array, mx.array]:
    mx.random.seed(seed)
    return (mx.random.normal((rows, HEADS, steps, DIM)).astype(mx.float16),
            mx.random.normal((rows, HEADS, steps, DIM)).astype(mx.float16))


def _round(x: mx.array, bits: int) -> mx.array:
    return mx.dequantize(*mx.quantize(x, group_size=64, bits=bits), group_size=64, bits=bits)


class Pair:
    """The quantized cache and the reference, driven alike."""

    def __init__(self, quant: Any, ref: Any, bits: int) -> None:
        self.quant, self.ref, self.bits = quant, ref, bits

    def update(self, keys: mx.array, values: mx.array) -> None:
        self.quant.update_and_fetch(keys, values)
        self.ref.update_and_fetch(_round(keys, self.bits), _round(values, self.bits))

    def check(self) -> None:
        keys, values = self.quant.keys_and_values()
        ref_keys, ref_values = self.ref.keys_and_values()
        for got, want in ((keys, ref_keys), (values, ref_values)):
            plain = mx.dequantize(*got, group_size=64, bits=self.bits)
            assert plain.shape == want.shape
            # Padding columns hold whatever each cache left there: compare the live ones.
            live = self.ref.make_mask(1)[:, 0, -1, :-1]
            diff = mx.abs(plain - want).max(axis=(1, 3)) * live
            assert diff.max().item() < 1e-5
        assert self.quant.offset.tolist() == self.ref.offset.tolist()
        assert self.quant.left_padding.tolist() == self.ref.left_padding.tolist()
        assert self.quant.size() == self.ref.size()
        assert mx.array_equal(self.quant.make_mask(3), self.ref.make_mask(3))


def _sequences(lengths: list[int], bits: int, seed: int) -> Pair:
    quant, ref = [], []
    for i, n in enumerate(lengths):
        q, r = SequenceKVCache(group_size=64, bits=bits), KVCache()
        if n:
            keys, values = _kv(1, n, seed + i)
            q.update_and_fetch(keys, values)
            r.update_and_fetch(_round(keys, bits), _round(values, bits))
        quant.append(q)
        ref.append(r)
    return Pair(SequenceKVCache.merge(quant), BatchKVCache.merge(ref), bits)


@pytest.mark.parametrize("bits", [4, 8])
def test_merge_prefill_and_decode_match_the_unquantized_batch(bits: int) -> None:
    """Merging cached sequences, a right-padded prefill chunk and decode steps agree."""
    pair = _sequences([5, 0, 9], bits, seed=1)
    assert isinstance(pair.quant, QuantizedBatchKVCache)
    pair.check()
    for cache in (pair.quant, pair.ref):  # rows prefill 3, 1 and 2 more tokens
        cache.prepare(lengths=[3, 1, 2], right_padding=[0, 2, 1])
    pair.update(*_kv(3, 3, seed=7))
    pair.quant.finalize()
    pair.ref.finalize()
    pair.check()
    for step in range(300):  # past a 256-position block: the cache grows
        pair.update(*_kv(3, 1, seed=100 + step))
    pair.check()


def test_filter_and_extend_across_batch_changes() -> None:
    """Sequences leaving (filter) and joining (extend) keep every row's KV in place."""
    pair = _sequences([4, 7], 8, seed=2)
    pair.update(*_kv(2, 1, seed=3))
    pair.quant.filter([0])  # the shorter row stays: the padding every row shares goes
    pair.ref.filter([0])
    assert pair.quant.size() == 5
    pair.check()
    other = _sequences([12, 3], 8, seed=4)
    pair.quant.extend(other.quant)
    pair.ref.extend(other.ref)
    pair.check()
    pair.update(*_kv(3, 1, seed=5))
    pair.check()
    empty = _sequences([0], 8, seed=6)  # a fresh sequence joining a running batch
    pair.quant.extend(empty.quant)
    pair.ref.extend(empty.ref)
    pair.check()


def test_trim_takes_back_speculated_positions() -> None:
    """trim(n) forgets the last n positions, as speculation's rejected drafts need."""
    pair = _sequences([6, 2], 4, seed=8)
    pair.update(*_kv(2, 4, seed=9))
    assert pair.quant.trim(3) == pair.ref.trim(3) == 3
    pair.check()
    pair.update(*_kv(2, 1, seed=10))
    pair.check()


@pytest.mark.parametrize("bits", [4, 8])
def test_extract_and_state_round_trip_for_the_prefix_cache(bits: int) -> None:
    """A row extracted, stored by state and merged back is bit-for-bit what was there."""
    pair = _sequences([3, 8], bits, seed=11)
    pair.update(*_kv(2, 2, seed=12))
    row = pair.quant.extract(0)
    assert row.size() == pair.ref.extract(0).offset == 5
    stored = SequenceKVCache.from_state(row.state)
    assert (stored.bits, stored.group_size, stored.size()) == (bits, 64, 5)
    again = SequenceKVCache.merge([stored])
    start = int(pair.quant.left_padding[0].item())
    for got, want in zip(again.keys_and_values()[0], pair.quant.keys_and_values()[0],
                         strict=True):
        assert mx.array_equal(got[0], want[0, :, start:])
    batch = QuantizedBatchKVCache.from_state(pair.quant.state)
    batch.meta_state = pair.quant.meta_state
    assert (batch.bits, batch.size(), batch.nbytes) == (bits, pair.quant.size(),
                                                        pair.quant.nbytes)


def test_quantized_attention_over_the_batch_matches_dequantized_attention() -> None:
    """Attention read straight from the packed cache (grouped heads, padded rows) equals
    attention over its dequantized copy."""
    pair = _sequences([5, 9], 8, seed=13)
    queries = mx.random.normal((2, 2 * HEADS, 1, DIM)).astype(mx.float16)
    mask, ref_mask = pair.quant.make_mask(1), pair.ref.make_mask(1)  # as a model does,
    pair.update(*_kv(2, 1, seed=15))  # then the layer stores this step's KV
    keys, values = pair.quant.keys_and_values()
    got = quantized_scaled_dot_product_attention(  # scales its queries in place: a copy
        mx.array(queries), keys, values, scale=DIM**-0.5, mask=mask, group_size=64, bits=8)
    want = mx.fast.scaled_dot_product_attention(
        queries, *pair.ref.keys_and_values(), scale=DIM**-0.5, mask=ref_mask)
    assert mx.allclose(got, want, atol=2e-3).item()


def test_4_bit_cache_holds_under_a_third_of_16_bit_kv() -> None:
    """The memory win: 4 bits plus a scale and bias per 64 values, against float16."""
    pair = _sequences([256], 4, seed=14)
    sixteen = 2 * 256 * HEADS * DIM * 2
    assert pair.quant.nbytes <= sixteen * 0.29


def test_a_chunk_attends_exactly_a_decode_step_quantized() -> None:
    """A prompt chunk gets dequantized history plus its own exact KV (and no `bits`, so
    the model's attention is the float one); a single position gets the packed cache."""
    pair = _sequences([4], 8, seed=16)
    keys, values = _kv(1, 3, seed=17)
    got_k, got_v = pair.quant.update_and_fetch(keys, values)
    assert not hasattr(pair.quant, "bits")
    history = mx.dequantize(*pair.quant.keys_and_values()[0], group_size=64, bits=8)[..., :4, :]
    assert mx.array_equal(got_k[..., 4:, :], keys) and mx.array_equal(got_v[..., 4:, :], values)
    assert mx.array_equal(got_k[..., :4, :], history)
    packed, _ = pair.quant.update_and_fetch(*_kv(1, 1, seed=18))
    assert pair.quant.bits == 8 and packed[0].dtype == mx.uint32
