"""Two micro-batches in flight across pipeline ranks: a measured prototype, not on the
serving path (bench/pipeline_micro.py measures it; docs/placement.md has the figures).

The pipelined forward (mlx-lm's, and ours in serving/model/pipeline_dense.py) runs one
stage at a time: the last rank runs the first layers and sends the hidden state on,
then waits while rank 0 runs the rest. Here a greedy decode batch is split into
micro-batches, each with its own KV cache, and passed along the stages one after the
other, so that while rank 0 runs its layers for micro-batch x the last rank runs its
layers for micro-batch y:

    last rank (first layers):  A(x,s) A(y,s) .. wait tok(x,s) A(x,s+1) .. wait tok(y,s) A(y,s+1)
    rank 0 (last layers+head):  ..... B(x,s) -> tok(x,s)        B(y,s) -> tok(y,s)        B(x,s+1)

Rank 0 alone computes the head and picks the tokens, and sends them to the first stage,
which embeds them for the next step (the plain step instead all_gathers the hidden state
so every rank computes the head). With one micro-batch the same schedule is the plain
step's one-stage-at-a-time order, which the bench uses as a control.

Each rank evaluates what it receives apart from what it computes, to time how long it
waits (MLX's ring backend spins while receiving, so CPU time cannot tell waiting from
working). Sending never waits for the peer's receive here (the ring backend buffers
small messages), which the schedule needs: rank 0 sends tok(x,s) while the first stage
may still be sending h(y,s). Hidden states large enough to block would be safe too (the
tokens, a few bytes, always get through), but are not what was measured.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import mlx.core as mx
import numpy as np
from mlx_lm.models.cache import KVCache

from serving.model.pipeline_dense import DenseStage, _sliding


@dataclass
class StageTimes:
    """Where one rank's decode time went."""

    wait_s: float = 0.0  # blocked receiving from the neighbouring stage
    work_s: float = 0.0  # building and computing its layers (and queueing its sends)

    @property
    def busy_share(self) -> float:
        total = self.wait_s + self.work_s
        return self.work_s / total if total else 0.0


@dataclass
class DecodeResult:
    tokens: list[list[int]]  # per sequence, in batch order; only rank 0's are the output
    seconds: float
    times: StageTimes = field(default_factory=StageTimes)


def split_cache(cache: list[Any], rows: slice) -> list[Any]:
    """A copy of a batch's per-layer KV caches holding only `rows` of the batch."""
    parts = []
    for layer in cache:
        part = KVCache()
        if layer.keys is not None:
            part.keys, part.values = layer.keys[rows], layer.values[rows]
            part.offset = layer.offset
        parts.append(part)
    mx.eval([(c.keys, c.values) for c in parts if c.keys is not None])
    return parts


def halves(batch: int, parts: int) -> list[slice]:
    """`parts` contiguous row ranges as even as possible (the first ones one row larger)."""
    base, extra = divmod(batch, parts)
    bounds = [0]
    for i in range(parts):
        bounds.append(bounds[-1] + base + (1 if i < extra else 0))
    return [slice(bounds[i], bounds[i + 1]) for i in range(parts) if bounds[i] < bounds[i + 1]]


def plain_decode(model: Any, cache: list[Any], first: mx.array, steps: int) -> DecodeResult:
    """Greedy decode as the pipelined model's own forward runs it (every rank gets the
    logits through the adapter's all_gather): the baseline."""
    started = time.perf_counter()
    token = first
    out = [first]
    for _ in range(steps - 1):
        token = mx.argmax(model(token[:, None], cache=cache)[:, -1], axis=-1)
        mx.eval(token)
        out.append(token)
    seconds = time.perf_counter() - started
    return DecodeResult(_rows(out), seconds)


class MicroBatchPipeline:
    """Greedy decode of micro-batches staggered across the pipeline's stages."""

    def __init__(self, model: Any, group: mx.distributed.Group) -> None:
        inner = model.model
        if not isinstance(inner, DenseStage):
            raise TypeError("the prototype drives serving/model/pipeline_dense.py's stages")
        if group.size() < 2:
            raise ValueError("micro-batches need at least 2 pipeline ranks")
        self.model, self.inner = model, inner
        self.rank, self.size = group.rank(), group.size()
        self.first_stage = self.size - 1  # runs the model's first layers
        probe = inner.embed_tokens(mx.zeros((1, 1), dtype=mx.int32))
        self.hidden_dtype = inner._hidden_dtype(probe)
        self.hidden_size = probe.shape[-1]

    def decode(self, caches: list[list[Any]], first: list[mx.array], steps: int) -> DecodeResult:
        """`steps` tokens per sequence (the first from prefill, known to every rank), for
        micro-batches with their own caches; rank 0's result holds the tokens."""
        times = StageTimes()
        started = time.perf_counter()
        tokens = list(first)
        out: list[list[mx.array]] = [[t] for t in first]
        for step in range(1, steps):
            for m, cache in enumerate(caches):
                h = self._receive(tokens[m], step, times)
                began = time.perf_counter()
                h = self._layers(h, cache)
                if self.rank == 0:
                    tokens[m] = mx.argmax(self._head(h)[:, -1], axis=-1).astype(mx.int32)
                    sent = [tokens[m]]
                    if step < steps - 1:  # the first stage needs it for the next step
                        sent.append(mx.distributed.send(tokens[m], self.first_stage))
                    mx.eval(sent)
                    out[m].append(tokens[m])
                else:
                    mx.eval(mx.distributed.send(h, self.rank - 1))
                times.work_s += time.perf_counter() - began
        seconds = time.perf_counter() - started
        return DecodeResult([row for m in out for row in _rows(m)], seconds, times)

    def _receive(self, token: mx.array, step: int, times: StageTimes) -> mx.array:
        """This stage's input for one micro-batch: the first stage embeds the tokens rank 0
        picked (received, but for step 1, whose tokens came from prefill); every other stage
        receives the previous stage's hidden state."""
        began = time.perf_counter()
        rows = token.shape[0]
        if self.rank == self.first_stage:
            if step > 1:
                token = mx.distributed.recv((rows,), mx.int32, 0)
                mx.eval(token)
            times.wait_s += time.perf_counter() - began
            return self.inner.embed_tokens(token[:, None])
        h = mx.distributed.recv((rows, 1, self.hidden_size), self.hidden_dtype, self.rank + 1)
        mx.eval(h)
        times.wait_s += time.perf_counter() - began
        return h

    def _layers(self, h: mx.array, cache: list[Any]) -> mx.array:
        layers = self.inner.pipeline_layers
        full_mask, sliding_mask = self.inner._masks(h, layers, cache)
        for layer, layer_cache in zip(layers, cache, strict=True):
            h = layer(h, sliding_mask if _sliding(layer) else full_mask, cache=layer_cache)
        return h

    def _head(self, h: mx.array) -> mx.array:
        h = self.inner.norm(h)
        if self.model.args.tie_word_embeddings:
            return self.inner.embed_tokens.as_linear(h)
        return self.model.lm_head(h)


def _rows(steps: list[mx.array]) -> list[list[int]]:
    """Per-step token vectors -> per-sequence token lists."""
    return [[int(t) for t in row] for row in np.array(mx.stack(steps, axis=1))]
