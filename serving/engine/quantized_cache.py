"""A quantized KV cache for continuous batching, beside mlx-lm's BatchKVCache.

mlx-lm 0.32 quantizes the KV cache only in its single-stream generator: its BatchGenerator
merges per-sequence caches through a `merge` that QuantizedKVCache lacks, and its
BatchKVCache has no quantized form. These two classes fill that gap:

- `SequenceKVCache`: one sequence's quantized KV (mlx-lm's QuantizedKVCache, plus `merge`
  and `size`), what a fresh sequence starts with and what the prefix cache stores.
- `QuantizedBatchKVCache`: the batch's cache, left-padded like BatchKVCache, holding each
  of keys and values as mlx's (packed, scales, biases) triple.

Attention reads the triples with `quantized_matmul` (mlx-lm's models dispatch to
`quantized_scaled_dot_product_attention` when the cache has `bits`), so no step
dequantizes the cache. Merging, extending, filtering and extracting move packed data as
it is: an entry reused from the prefix cache is bit-for-bit what was stored, never
re-quantized (mlx-lm pull request 941 dequantized on merge and quantized again on
extract, losing precision on every round trip and the memory win while batching).
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
from mlx_lm.models.base import create_causal_mask
from mlx_lm.models.cache import QuantizedKVCache, _BaseCache, dynamic_roll

Triple = tuple[mx.array, mx.array, mx.array]  # mx.quantize's (packed, scales, biases)


def _map(fn: Any, triple: Triple) -> Triple:
    a, b, c = triple
    return fn(a), fn(b), fn(c)


class SequenceKVCache(QuantizedKVCache):
    """One sequence's quantized KV, batchable: BatchGenerator merges these per layer."""

    def size(self) -> int:
        return int(self.offset)

    @classmethod
    def merge(cls, caches: list[Any]) -> QuantizedBatchKVCache:
        return QuantizedBatchKVCache.merge(caches)


class QuantizedBatchKVCache(_BaseCache):
    """The batch's quantized KV: rows left-padded to a common length `_idx`.

    The same contract as mlx-lm's BatchKVCache (prepare/finalize for right-padded
    prefill chunks, filter/extend as sequences leave and join, extract into the prefix
    cache, trim for speculation), on (packed, scales, biases) triples.
    """

    step = 256

    def __init__(self, left_padding: list[int], group_size: int = 64, bits: int = 8) -> None:
        self.keys: Triple | None = None
        self.values: Triple | None = None
        self.left_padding = mx.array(left_padding)
        self.offset = mx.array([-p for p in left_padding])
        self._idx = 0
        self._right_padding: mx.array | None = None
        self.group_size = group_size
        self._bits = bits
        self._exact = False  # the latest update was a chunk: it attends in full precision

    @property
    def bits(self) -> int:
        """mlx-lm's models call quantized attention when the cache has `bits`: after a
        chunk of several positions it has none (AttributeError), so that chunk attends
        over exact keys and values through mx.fast.scaled_dot_product_attention."""
        if self._exact:
            raise AttributeError("bits")
        return self._bits

    # -- the forward pass ---------------------------------------------------------------
    def update_and_fetch(
        self, keys: mx.array, values: mx.array
    ) -> tuple[Triple, Triple] | tuple[mx.array, mx.array]:
        """Quantize the new positions only and store them. A decode step (one position)
        gets the live prefix quantized, for quantized attention. A chunk of several (a
        prompt's, or speculation's drafts) gets the history dequantized and its own
        positions exact: a token attending to its neighbours quantized was what broke
        the bundled model (SmolLM2 answered "L'Étoile" to "What is the capital of
        France?" with its prompt read through 8-bit keys, "Paris" with only the stored
        history quantized, as mlx-lm's single-stream kv_bits does)."""
        prev, steps = self._idx, keys.shape[2]
        history = self._dequantized(prev) if steps > 1 and prev else None
        if self.keys is None or self.values is None or prev + steps > self.keys[0].shape[2]:
            self._grow(keys, values, steps)
        assert self.keys is not None and self.values is not None
        self.offset = self.offset + steps
        self._idx += steps
        new_k = mx.quantize(keys, group_size=self.group_size, bits=self._bits)
        new_v = mx.quantize(values, group_size=self.group_size, bits=self._bits)
        for stored, new in ((self.keys, new_k), (self.values, new_v)):
            for part, fresh in zip(stored, new, strict=True):
                part[..., prev : self._idx, :] = fresh
        self._exact = steps > 1
        if not self._exact:
            return self.keys_and_values()
        if history is None:
            return keys, values
        return (mx.concatenate([history[0], keys], axis=2),
                mx.concatenate([history[1], values], axis=2))

    def _dequantized(self, end: int) -> tuple[mx.array, mx.array]:
        """Keys and values of positions [0, end) in full precision (one layer's, while a
        chunk is computed)."""
        assert self.keys is not None and self.values is not None
        return tuple(  # type: ignore[return-value]
            mx.dequantize(*_map(lambda x: x[..., :end, :], triple),
                          group_size=self.group_size, bits=self._bits)
            for triple in (self.keys, self.values))

    def _grow(self, keys: mx.array, values: mx.array, steps: int) -> None:
        """Room for `steps` more positions, in whole blocks of `step` (like KVCache)."""
        batch, heads = keys.shape[0], keys.shape[1]
        length = (self.step + steps - 1) // self.step * self.step
        per_word = 32 // self._bits

        def blank(dim: int) -> Triple:
            shape = (batch, heads, length)
            return (
                mx.zeros((*shape, dim // per_word), dtype=mx.uint32),
                mx.zeros((*shape, dim // self.group_size), dtype=keys.dtype),
                mx.zeros((*shape, dim // self.group_size), dtype=keys.dtype),
            )

        new_k, new_v = blank(keys.shape[3]), blank(values.shape[3])
        if self.keys is None or self.values is None:
            self.keys, self.values = new_k, new_v
            return
        prev = self._idx
        old_k = _map(lambda x: x[..., :prev, :], self.keys)
        old_v = _map(lambda x: x[..., :prev, :], self.values)
        self.keys = tuple(  # type: ignore[assignment]
            mx.concatenate([a, b], axis=2) for a, b in zip(old_k, new_k, strict=True))
        self.values = tuple(  # type: ignore[assignment]
            mx.concatenate([a, b], axis=2) for a, b in zip(old_v, new_v, strict=True))

    def keys_and_values(self) -> tuple[Triple, Triple]:
        assert self.keys is not None and self.values is not None
        idx = self._idx
        return (_map(lambda x: x[..., :idx, :], self.keys),
                _map(lambda x: x[..., :idx, :], self.values))

    def make_mask(self, N: int, return_array: bool = False, **kwargs: Any) -> mx.array:
        # Always an array: the rows' left padding must be masked, and quantized
        # attention takes a boolean mask broadcast over the query-head groups.
        return create_causal_mask(N, offset=self._idx, left_padding=self.left_padding, **kwargs)

    # -- chunked prefill of prompts of different lengths -----------------------------------
    def prepare(self, *, left_padding: list[int] | None = None,
                lengths: list[int] | None = None,
                right_padding: list[int] | None = None) -> None:
        if left_padding is not None:
            if self.keys is not None:
                raise ValueError("left padding can only be added to an empty cache")
            pad = mx.array(left_padding)
            self.left_padding = self.left_padding + pad
            self.offset = self.offset - pad
        if right_padding is not None and max(right_padding) > 0:
            self._right_padding = mx.array(right_padding)

    def finalize(self) -> None:
        """After a right-padded chunk: roll each row so its padding moves to the left."""
        pad = self._right_padding
        if pad is None or self.keys is None or self.values is None:
            return
        self.keys = _map(lambda x: dynamic_roll(x, pad[:, None], axis=2), self.keys)
        self.values = _map(lambda x: dynamic_roll(x, pad[:, None], axis=2), self.values)
        self.offset = self.offset - pad
        self.left_padding = self.left_padding + pad
        self._right_padding = None

    # -- sequences leaving and joining ---------------------------------------------------
    def filter(self, batch_indices: list[int] | mx.array) -> None:
        """Keep these rows, then drop the padding columns every remaining row shares."""
        if self.keys is not None and self.values is not None:
            self.keys = _map(lambda x: x[batch_indices], self.keys)
            self.values = _map(lambda x: x[batch_indices], self.values)
        self.offset = self.offset[batch_indices]
        self.left_padding = self.left_padding[batch_indices]
        shared = int(self.left_padding.min().item())  # type: ignore[arg-type]
        if shared > 0:
            if self.keys is not None and self.values is not None:
                self.keys = _map(lambda x: x[..., shared:, :], self.keys)
                self.values = _map(lambda x: x[..., shared:, :], self.values)
            self._idx -= shared
            self.left_padding = self.left_padding - shared

    def extend(self, other: QuantizedBatchKVCache) -> None:
        """Append other's rows, both right-justified to the longer one's `_idx`."""
        if self.keys is None and other.keys is None:
            self.left_padding = mx.concatenate([self.left_padding, other.left_padding])
            self.offset = mx.concatenate([self.offset, other.offset])
            return
        template = self if self.keys is not None else other
        assert template.keys is not None and template.values is not None
        max_idx = max(self._idx, other._idx)
        size = max(c.keys[0].shape[2] for c in (self, other) if c.keys is not None)
        parts = [_justified(c, template, max_idx, size) for c in (self, other)]
        self.keys = tuple(  # type: ignore[assignment]
            mx.concatenate([p[0][i] for p in parts]) for i in range(3))
        self.values = tuple(  # type: ignore[assignment]
            mx.concatenate([p[1][i] for p in parts]) for i in range(3))
        self.offset = mx.concatenate([self.offset, other.offset])
        self.left_padding = mx.concatenate([p[2] for p in parts])
        self._idx = max_idx

    def extract(self, idx: int) -> SequenceKVCache:
        """Row idx without its padding, as a sequence cache (for the prefix cache)."""
        assert self.keys is not None and self.values is not None
        pad = int(self.left_padding[idx].item())  # type: ignore[arg-type]
        end = self._idx
        cache: Any = SequenceKVCache(group_size=self.group_size, bits=self._bits)
        cache.keys = _map(lambda x: mx.contiguous(x[idx : idx + 1, :, pad:end]), self.keys)
        cache.values = _map(lambda x: mx.contiguous(x[idx : idx + 1, :, pad:end]), self.values)
        cache.offset = end - pad
        return cache

    @classmethod
    def merge(cls, caches: list[Any]) -> QuantizedBatchKVCache:
        """One batch cache from sequence caches, each right-justified, packed data copied
        as it is (never dequantized)."""
        group_size, bits = caches[0].group_size, caches[0].bits
        if any((c.group_size, c.bits) != (group_size, bits) for c in caches):
            raise ValueError("cannot merge KV caches quantized differently")
        lengths = [c.size() for c in caches]
        longest = max(lengths)
        padding = [longest - n for n in lengths]
        batch = cls(padding, group_size=group_size, bits=bits)
        if longest == 0:
            return batch
        full: Any = next(c for c in caches if c.keys is not None and c.size() > 0)

        def blank(part: mx.array) -> mx.array:
            return mx.zeros((len(caches), part.shape[1], longest, part.shape[3]), part.dtype)

        keys: Triple = _map(blank, full.keys)
        values: Triple = _map(blank, full.values)
        for row, (pad, cache) in enumerate(zip(padding, caches, strict=True)):
            n = cache.size()
            if n == 0:
                continue
            for stored, src in ((keys, cache.keys), (values, cache.values)):
                for part, data in zip(stored, src, strict=True):
                    part[row : row + 1, :, pad : pad + n] = data[..., :n, :]
        batch.keys, batch.values = keys, values
        batch.offset = batch.offset + longest
        batch._idx = longest
        return batch

    # -- speculation, bookkeeping ----------------------------------------------------------
    def is_trimmable(self) -> bool:
        return True

    def trim(self, n: int) -> int:
        n = min(self._idx, n)
        self._idx -= n
        self.offset = self.offset - n
        return n

    def size(self) -> int:
        return self._idx

    def empty(self) -> bool:
        return self.keys is None

    @property
    def state(self) -> tuple[Any, ...]:
        return self.keys, self.values, self.offset, self.left_padding, self._idx

    @state.setter
    def state(self, v: tuple[Any, ...]) -> None:
        self.keys, self.values, self.offset, self.left_padding, self._idx = v

    @property
    def meta_state(self) -> tuple[str, str]:
        return str(self.group_size), str(self._bits)

    @meta_state.setter
    def meta_state(self, v: tuple[str, str]) -> None:
        self.group_size, self._bits = int(v[0]), int(v[1])
        self._exact = False

    @property
    def nbytes(self) -> int:
        if self.keys is None or self.values is None:
            return 0
        return sum(x.nbytes for x in (*self.keys, *self.values))


def _justified(cache: QuantizedBatchKVCache, template: QuantizedBatchKVCache,
               max_idx: int, size: int) -> tuple[Triple, Triple, mx.array]:
    """cache's triples padded so its `_idx` lands at max_idx in `size` columns, and
    its left padding then (a cache with no keys yet gets zero columns from template)."""
    assert template.keys is not None and template.values is not None
    rows = cache.offset.shape[0]

    def empty(part: mx.array) -> mx.array:
        return mx.zeros((rows, part.shape[1], 0, part.shape[3]), dtype=part.dtype)

    keys = cache.keys if cache.keys is not None else _map(empty, template.keys)
    values = cache.values if cache.values is not None else _map(empty, template.values)
    left = max_idx - cache._idx
    right = size - keys[0].shape[2] - left

    def pad(x: mx.array) -> mx.array:
        if right < 0:
            x = x[..., :right, :]
        if left or right > 0:
            x = mx.pad(x, [(0, 0), (0, 0), (left, max(right, 0)), (0, 0)])
        return x

    return _map(pad, keys), _map(pad, values), cache.left_padding + left
