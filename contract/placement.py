"""Where the model's weights go: tensor parallel (every rank holds 1/n of every layer) or
pipeline parallel (every rank holds a contiguous range of layers). The orchestrator
decides it (orchestrator/placement/) and shows it in `plan`, `status` and `/metrics`;
each rank is told only its split (RankSettings.pipeline_split)."""

from __future__ import annotations

from typing import Literal

import msgspec

ParallelMode = Literal["tensor", "pipeline"]
# Architectures mlx-lm cannot pipeline as it stands, for which serving/model/ has an
# adapter in mlx-lm's own PipelineMixin pattern.
PIPELINE_ADAPTERS = ("llama", "qwen3")


class RankShare(msgspec.Struct, kw_only=True, omit_defaults=True):
    rank: int
    node: str
    # Pipeline: the rank's layers, a half-open range [start, end) in the model's numbering.
    layers: tuple[int, int] | None = None
    weight_bytes: int  # its weights (pipeline: its layers plus embeddings and head)
    kv_bytes: int  # one full-context sequence of KV cache in its layers
    budget_bytes: int | None = None  # what it may use: node memory, memory_gb, less reserve
    # KV it may hold ([serving] kv_cache_gb, else its budget less its weights), and how
    # many full-context sequences that is (contract/kv_cache.py); None: memory unknown.
    kv_budget_bytes: int | None = None
    kv_sequences: int | None = None


class Placement(msgspec.Struct, kw_only=True, omit_defaults=True):
    mode: ParallelMode
    reason: str  # why this mode ("9 attention heads do not divide by 2 ranks")
    layer_count: int | None = None
    context: int | None = None  # tokens of one full-context sequence (the KV figures')
    ranks: list[RankShare] = msgspec.field(default_factory=list)

    @property
    def pipeline_split(self) -> list[int] | None:
        """Layers per rank, indexed by rank: mlx-lm's `pipeline(group, split)`."""
        if self.mode != "pipeline":
            return None
        return [share.layers[1] - share.layers[0] for share in self.ranks if share.layers]
