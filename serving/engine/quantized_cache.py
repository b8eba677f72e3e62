"""A quantized KV cache for continuous batching, beside mlx-lm's BatchKVCache.

mlx-lm 0.32 quantizes the KV cache only in its single-stream generator: its BatchGenerator
merges per-sequence caches through a `merge` that QuantizedKVCache lacks, and its
BatchKVCache has no quantized form. These two classes fill that gap:

- `SequenceKVCache`: one sequence's KV, what a fresh sequence starts with and what the
  prefix cache stores.
- `QuantizedBatchKVCache`: the batch's cache, left-padded like BatchKVCache.

Each keeps its columns (token positions) in two parts (serving/engine/kv_window.py): the
older ones quantized, as mlx's (packed, scales, biases) triples (the layout of mlx-lm's
QuantizedKVCache and of mlx-vlm's batched one), and the `window` most recent ones exact,
in the activations' dtype (KIVI's residual window). Columns leave the window for the
quantized part in blocks of KV_WINDOW_BLOCK, so a decode step quantizes nothing most of
the time; `window` 0 quantizes every column as it is stored.

A decode step attends over [quantized history ; exact window] with quantized_matmul for
the history (kv_window.windowed_attention), so no step dequantizes the cache. A chunk of
several positions (a prompt's, or speculation's drafts) attends over the history
dequantized and the window and its own positions exact (a token reading its neighbours'
quantized keys was what broke the bundled model). Merging, extending, filtering and
extracting move packed data as it is: an entry reused from the prefix cache is what was
stored, never re-quantized (mlx-lm pull request 941 dequantized on merge and quantized
again on extract, losing precision on every round trip and the memory win).
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
from mlx_lm.models.base import create_causal_mask
from mlx_lm.models.cache import _BaseCache, dynamic_roll

from contract.kv_cache import window_block
from serving.engine import kv_window as kw
from serving.engine.kv_window import Triple, Windowed
from serving.engine.sequence_cache import SequenceKV


class SequenceKVCache(SequenceKV):
    """One sequence's quantized KV, batchable: BatchGenerator merges these per layer."""

    @classmethod
    def merge(cls, caches: list[Any]) -> QuantizedBatchKVCache:
        return QuantizedBatchKVCache.merge(caches)


def _rows(x: Any, index: Any) -> Any:
    if x is None:
        return None
    if isinstance(x, tuple):
        return tuple(part[index] for part in x)
    return x[index]


class QuantizedBatchKVCache(_BaseCache):
    """The batch's KV: rows left-padded to a common length `_idx`; columns [0, _q)
    quantized (`keys`/`values`, as wide as their columns after a flush), [_q, _idx) exact
    (`exact_keys`/`exact_values`, buffers of window + KV_WINDOW_BLOCK columns).

    The same contract as mlx-lm's BatchKVCache (prepare/finalize for right-padded
    prefill chunks, filter/extend as sequences leave and join, extract into the prefix
    cache, trim for speculation)."""

    def __init__(self, left_padding: list[int], group_size: int = 64, bits: int = 8,
                 window: int = 0) -> None:
        self.keys: Triple | None = None
        self.values: Triple | None = None
        self.exact_keys: mx.array | None = None
        self.exact_values: mx.array | None = None
        self.left_padding = mx.array(left_padding)
        self.offset = mx.array([-p for p in left_padding])
        self._idx = 0
        self._q = 0
        self._right_padding: mx.array | None = None
        self._most_right_padding = 0  # of _right_padding, as an int (no sync per layer)
        self.group_size, self._bits, self.window = group_size, bits, window
        self._exact = False  # the latest update attends in full precision
        kw.install()

    @property
    def bits(self) -> int:
        """mlx-lm's models call quantized attention when the cache has `bits`: after a
        chunk, or while every column is exact, it has none (AttributeError), so that
        step attends through mx.fast.scaled_dot_product_attention."""
        if self._exact:
            raise AttributeError("bits")
        return self._bits

    # -- the forward pass ---------------------------------------------------------------
    def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple[Any, Any]:
        """Store the new positions exact; columns leaving the window are quantized. A
        decode step gets [quantized ; exact] as Windowed triples (or, with nothing
        quantized yet, the exact arrays); a chunk gets everything in full precision."""
        steps = keys.shape[2]
        self._append(keys, values)
        self.offset = self.offset + steps
        if steps > 1:
            full = self.dequantized()
            self._flush(steps)
            self._exact = True
            return full
        self._flush(1)
        q, e = self._q, self._idx - self._q
        assert self.exact_keys is not None and self.exact_values is not None
        self._exact = q == 0
        if self._exact:
            return self.exact_keys[..., :e, :], self.exact_values[..., :e, :]
        assert self.keys is not None and self.values is not None
        keys_q, values_q = kw.upto(self.keys, q), kw.upto(self.values, q)
        if e == 0:
            return keys_q, values_q
        return (Windowed(keys_q, self.exact_keys[..., :e, :]),
                Windowed(values_q, self.exact_values[..., :e, :]))

    def dequantized(self) -> tuple[mx.array, mx.array]:
        """Every column's keys and values in full precision (a chunk's attention)."""
        assert self.exact_keys is not None and self.exact_values is not None
        q, e = self._q, self._idx - self._q
        exact_k, exact_v = self.exact_keys[..., :e, :], self.exact_values[..., :e, :]
        if not q:
            return exact_k, exact_v
        assert self.keys is not None and self.values is not None
        history = [kw.dequantize(kw.cols(t, 0, q), self.group_size, self._bits)
                   for t in (self.keys, self.values)]
        return (mx.concatenate([history[0], exact_k], axis=2),
                mx.concatenate([history[1], exact_v], axis=2))

    def _append(self, keys: mx.array, values: mx.array) -> None:
        e, steps = self._idx - self._q, keys.shape[2]
        if self.exact_keys is None or e + steps > self.exact_keys.shape[2]:
            room = max(self.window + window_block(self.window), e + steps)
            self.exact_keys = kw.room(self.exact_keys, e, room, keys)
            self.exact_values = kw.room(self.exact_values, e, room, values)
        assert self.exact_keys is not None and self.exact_values is not None
        self.exact_keys[..., e : e + steps, :] = keys
        self.exact_values[..., e : e + steps, :] = values
        self._idx += steps

    def _flush(self, steps: int) -> None:
        """Quantize the oldest exact columns once the window has a block more than it
        keeps. It keeps `window`, plus the right padding a pending finalize rolls
        across the boundary, plus (a few positions fed at once: speculation's drafts)
        what a trim may take back."""
        extra = self._most_right_padding
        block = window_block(self.window)
        e = self._idx - self._q
        if e < self.window + extra + block:
            return
        keep = self.window + extra + (steps - 1 if steps <= block else 0)
        if e > keep:
            self._to_quantized(e - keep)

    def _to_quantized(self, n: int) -> None:
        """Move the n oldest exact columns to the quantized part. The quantized part is
        exactly as wide as its columns (one concatenation per block of KV_WINDOW_BLOCK
        steps), never a slice of a wider buffer: quantized_matmul's CPU kernel copies a
        non-contiguous slice of the whole history on every step and layer."""
        assert self.exact_keys is not None and self.exact_values is not None
        q, e = self._q, self._idx - self._q
        quantized = []
        for stored, exact in ((self.keys, self.exact_keys), (self.values, self.exact_values)):
            fresh = kw.quantize(exact[..., :n, :], self.group_size, self._bits)
            quantized.append(kw.cat([kw.cols(stored, 0, q), fresh])
                             if stored is not None and q else fresh)
        self.keys, self.values = quantized
        room = self.window + window_block(self.window)
        self.exact_keys = kw.room(self.exact_keys[..., n:e, :], e - n, room, self.exact_keys)
        self.exact_values = kw.room(self.exact_values[..., n:e, :], e - n, room,
                                  self.exact_values)
        self._q += n

    def depend_on(self, x: mx.array) -> None:
        """Make the cache's state depend on x (a pipeline stage's send, which nothing
        else evaluated reads during a prefill): the exact part exists after any update."""
        if self.exact_keys is not None:
            self.exact_keys = mx.depends(self.exact_keys, x)

    def make_mask(self, N: int, return_array: bool = False, **kwargs: Any) -> mx.array:
        # Always an array: the rows' left padding must be masked, and quantized
        # attention takes a boolean mask broadcast over the query-head groups.
        return create_causal_mask(N, offset=self._idx, left_padding=self.left_padding, **kwargs)

    # -- chunked prefill of prompts of different lengths -----------------------------------
    def prepare(self, *, left_padding: list[int] | None = None,
                lengths: list[int] | None = None,
                right_padding: list[int] | None = None) -> None:
        if left_padding is not None:
            if not self.empty():
                raise ValueError("left padding can only be added to an empty cache")
            pad = mx.array(left_padding)
            self.left_padding = self.left_padding + pad
            self.offset = self.offset - pad
        if right_padding is not None and max(right_padding) > 0:
            self._right_padding = mx.array(right_padding)
            self._most_right_padding = max(right_padding)

    def finalize(self) -> None:
        """After a right-padded chunk: roll each row so its padding moves to the left.
        Row r moves right by pad[r] <= P, so the boundary moves right by P: the P oldest
        exact columns are quantized first and roll with the quantized part (_flush kept
        them exact until now)."""
        pad, most = self._right_padding, self._most_right_padding
        self._right_padding, self._most_right_padding = None, 0
        if pad is None or self.exact_keys is None or self.exact_values is None:
            return
        q, e = self._q, self._idx - self._q
        assert e >= most, "the window keeps the right padding until finalize"
        shift = pad[:, None]
        parts = []
        for stored, exact in ((self.keys, self.exact_keys), (self.values, self.exact_values)):
            head = kw.quantize(exact[..., :most, :], self.group_size, self._bits)
            both = kw.cat([kw.cols(stored, 0, q), head]) if stored is not None and q else head
            rolled = dynamic_roll(exact[..., :e, :], shift, axis=2)[..., most:, :]
            parts.append((kw.triple_of([dynamic_roll(x, shift, axis=2) for x in both]), rolled))
        (self.keys, exact_k), (self.values, exact_v) = parts
        room = self.window + window_block(self.window)
        self.exact_keys = kw.room(exact_k, e - most, room, exact_k)
        self.exact_values = kw.room(exact_v, e - most, room, exact_v)
        self._q += most
        self.offset = self.offset - pad
        self.left_padding = self.left_padding + pad

    # -- sequences leaving and joining ---------------------------------------------------
    def filter(self, batch_indices: list[int] | mx.array) -> None:
        """Keep these rows, then drop the padding columns every remaining row shares."""
        self.keys, self.values = _rows(self.keys, batch_indices), _rows(self.values,
                                                                         batch_indices)
        self.exact_keys = _rows(self.exact_keys, batch_indices)
        self.exact_values = _rows(self.exact_values, batch_indices)
        self.offset = self.offset[batch_indices]
        self.left_padding = self.left_padding[batch_indices]
        shared = int(self.left_padding.min().item())  # type: ignore[arg-type]
        if shared <= 0:
            return
        from_q = min(shared, self._q)
        if from_q and self.keys is not None and self.values is not None:
            self.keys, self.values = kw.cols(self.keys, from_q), kw.cols(self.values, from_q)
        if shared > from_q and self.exact_keys is not None and self.exact_values is not None:
            self.exact_keys = self.exact_keys[..., shared - from_q :, :]
            self.exact_values = self.exact_values[..., shared - from_q :, :]
        self._q -= from_q
        self._idx -= shared
        self.left_padding = self.left_padding - shared

    def extend(self, other: QuantizedBatchKVCache) -> None:
        """Append other's rows, both right-justified to the longer one's `_idx`, the
        exact part as wide as window_target says."""
        if self.empty() and other.empty():
            self.left_padding = mx.concatenate([self.left_padding, other.left_padding])
            self.offset = mx.concatenate([self.offset, other.offset])
            return
        total = max(self._idx, other._idx)
        target = kw.window_target(self.window, total,
                                  [(c._q, c._idx - c._q) for c in (self, other)])
        parts = [c.justified(total, target, (self, other)) for c in (self, other)]
        self.keys = kw.cat_rows([p[0] for p in parts])
        self.values = kw.cat_rows([p[1] for p in parts])
        self.exact_keys = mx.concatenate([p[2] for p in parts])
        self.exact_values = mx.concatenate([p[3] for p in parts])
        self.left_padding = mx.concatenate(
            [c.left_padding + (total - c._idx) for c in (self, other)])
        self.offset = mx.concatenate([self.offset, other.offset])
        self._idx, self._q = total, total - target

    def justified(self, total: int, target: int, shapes_from: tuple[Any, ...]
                  ) -> tuple[Triple, Triple, mx.array, mx.array]:
        """This cache's rows in `total` columns, the last `target` exact (kw.rebalance)."""
        q, e = self._q, self._idx - self._q
        rows = self.offset.shape[0]
        out: list[Any] = []
        for side in ("keys", "values"):
            shape = next(s for s in (_side_shape(c, side) for c in shapes_from) if s)
            stored = getattr(self, side)
            exact = getattr(self, "exact_" + side)
            out.extend(kw.rebalance(
                kw.cols(stored, 0, q) if stored is not None and q else None,
                exact[..., :e, :] if exact is not None and e else None,
                rows, total, target, shape, self.group_size, self._bits))
        return out[0], out[2], out[1], out[3]

    def extract(self, idx: int) -> SequenceKVCache:
        """Row idx without its padding, as a sequence cache (for the prefix cache)."""
        assert self.exact_keys is not None and self.exact_values is not None
        pad = int(self.left_padding[idx].item())  # type: ignore[arg-type]
        q, e = self._q, self._idx - self._q
        cache = SequenceKVCache(self.group_size, self._bits, self.window)
        if pad < q and self.keys is not None and self.values is not None:
            cache.keys = tuple(mx.contiguous(x[idx : idx + 1, :, pad:q])  # type: ignore[assignment]
                               for x in self.keys)
            cache.values = tuple(mx.contiguous(x[idx : idx + 1, :, pad:q])  # type: ignore[assignment]
                                 for x in self.values)
        first = max(pad - q, 0)
        cache.exact_keys = mx.contiguous(self.exact_keys[idx : idx + 1, :, first:e])
        cache.exact_values = mx.contiguous(self.exact_values[idx : idx + 1, :, first:e])
        cache.offset = self._idx - pad
        return cache

    @classmethod
    def merge(cls, caches: list[Any]) -> QuantizedBatchKVCache:
        """One batch cache from sequence caches, each right-justified, the exact part as
        wide as window_target says; packed data copied as it is."""
        first = caches[0]
        setting = (first.group_size, first.bits, first.window)
        if any((c.group_size, c.bits, c.window) != setting for c in caches):
            raise ValueError("cannot merge KV caches quantized differently")
        lengths = [c.size() for c in caches]
        total = max(lengths)
        batch = cls([total - n for n in lengths], *setting)
        if total == 0:
            return batch
        target = kw.window_target(first.window, total,
                               [(c.quantized_count(), c.size() - c.quantized_count())
                                for c in caches])
        rows = [_as_batch(c, setting).justified(total, target, tuple(caches)) for c in caches]
        batch.keys = kw.cat_rows([r[0] for r in rows])
        batch.values = kw.cat_rows([r[1] for r in rows])
        batch.exact_keys = mx.concatenate([r[2] for r in rows])
        batch.exact_values = mx.concatenate([r[3] for r in rows])
        batch.offset = batch.offset + total
        batch._idx, batch._q = total, total - target
        return batch

    # -- speculation, bookkeeping ----------------------------------------------------------
    def is_trimmable(self) -> bool:
        return True

    def trim(self, n: int) -> int:
        """Forget the last n positions: the exact ones first."""
        n = min(self._idx, n)
        self._q = min(self._q, self._idx - n)
        self._idx -= n
        self.offset = self.offset - n
        return n

    def size(self) -> int:
        return self._idx

    def empty(self) -> bool:
        return self.keys is None and self.exact_keys is None

    @property
    def state(self) -> tuple[Any, ...]:
        return (self.keys, self.values, self.exact_keys, self.exact_values, self.offset,
                self.left_padding)

    @state.setter
    def state(self, v: tuple[Any, ...]) -> None:
        (self.keys, self.values, self.exact_keys, self.exact_values, self.offset,
         self.left_padding) = v

    @property
    def meta_state(self) -> tuple[str, ...]:
        return tuple(map(str, (self.group_size, self._bits, self.window, self._q, self._idx)))

    @meta_state.setter
    def meta_state(self, v: tuple[str, ...]) -> None:
        self.group_size, self._bits, self.window, self._q, self._idx = map(int, v)
        self._exact, self._right_padding, self._most_right_padding = False, None, 0

    @property
    def nbytes(self) -> int:
        arrays = [*(self.keys or ()), *(self.values or ()), self.exact_keys, self.exact_values]
        return sum(x.nbytes for x in arrays if x is not None)


def _side_shape(cache: Any, side: str) -> tuple[int, int, mx.Dtype] | None:
    bits = getattr(cache, "_bits", getattr(cache, "bits", 8))
    return kw.side_shape(getattr(cache, side), getattr(cache, "exact_" + side), bits)


def _as_batch(cache: SequenceKV, setting: tuple[int, int, int]) -> QuantizedBatchKVCache:
    """A sequence cache seen as a one-row batch (no padding), sharing its arrays."""
    row = QuantizedBatchKVCache([0], *setting)
    row.keys, row.values = cache.keys, cache.values
    row.exact_keys, row.exact_values = cache.exact_keys, cache.exact_values
    row._idx, row._q = cache.size(), cache.quantized_count()
    return row
