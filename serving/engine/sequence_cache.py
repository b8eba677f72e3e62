"""One sequence's quantized KV (with its exact window): what a fresh sequence starts with
and what the prefix cache stores. serving/engine/quantized_cache.py's SequenceKVCache
adds the `merge` BatchGenerator batches them with."""

from __future__ import annotations

from typing import Any

import mlx.core as mx
from mlx_lm.models.cache import _BaseCache

from serving.engine import kv_window as kw
from serving.engine.kv_window import Triple


class SequenceKV(_BaseCache):
    """One sequence's KV: `keys`/`values` its quantized columns (triples, exactly as many
    as it holds), `exact_keys`/`exact_values` its most recent ones."""

    def __init__(self, group_size: int = 64, bits: int = 8, window: int = 0) -> None:
        self.keys: Triple | None = None
        self.values: Triple | None = None
        self.exact_keys: mx.array | None = None
        self.exact_values: mx.array | None = None
        self.offset = 0
        self.group_size, self.bits, self.window = group_size, bits, window

    def quantized_count(self) -> int:
        return self.keys[0].shape[2] if self.keys is not None else 0

    def size(self) -> int:
        return int(self.offset)

    def empty(self) -> bool:
        return self.offset == 0

    def is_trimmable(self) -> bool:
        return True

    def trim(self, n: int) -> int:
        """Forget the last n positions (the prefix cache's partial reuse)."""
        n = min(self.offset, n)
        exact = self.offset - self.quantized_count()
        cut_e, cut_q = min(n, exact), n - min(n, exact)
        if cut_e and self.exact_keys is not None and self.exact_values is not None:
            self.exact_keys = self.exact_keys[..., : exact - cut_e, :]
            self.exact_values = self.exact_values[..., : exact - cut_e, :]
        if cut_q and self.keys is not None and self.values is not None:
            keep = self.quantized_count() - cut_q
            self.keys, self.values = kw.cols(self.keys, 0, keep), kw.cols(self.values, 0, keep)
        self.offset -= n
        return n

    @property
    def state(self) -> tuple[Any, ...]:
        return self.keys, self.values, self.exact_keys, self.exact_values

    @state.setter
    def state(self, v: tuple[Any, ...]) -> None:
        self.keys, self.values, self.exact_keys, self.exact_values = v

    @property
    def meta_state(self) -> tuple[str, ...]:
        return tuple(map(str, (self.offset, self.group_size, self.bits, self.window)))

    @meta_state.setter
    def meta_state(self, v: tuple[str, ...]) -> None:
        self.offset, self.group_size, self.bits, self.window = map(int, v)

    @property
    def nbytes(self) -> int:
        arrays = [*(self.keys or ()), *(self.values or ()), self.exact_keys, self.exact_values]
        return sum(x.nbytes for x in arrays if x is not None)
