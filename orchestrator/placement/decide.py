"""Tensor or pipeline, and each rank's share: decided from the model's config and each
node's memory, before anything starts.

`[cluster] parallel = "auto"` takes tensor parallelism when the attention and KV heads
divide by the rank count and every node holds its equal share (lowest latency on equal
Macs), else pipeline parallelism when mlx-lm can pipeline the architecture, with layers
weighted by what each node can hold. A job is one or the other over all ranks: MLX's
ring and JACCL groups cannot be split.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from contract.fingerprint import ModelConfigInfo, ModelInfo, NodeFingerprint, ranks_on_machine
from contract.placement import Placement, RankShare
from orchestrator.config import ClusterSpec
from orchestrator.placement.architectures import pipeline_architectures, supports_pipeline
from orchestrator.placement.kv_fit import fill_kv
from orchestrator.placement.model_size import (
    ModelShape,
    UnknownShape,
    bytes_per_param,
    kv_bytes,
    model_shape,
)
from orchestrator.placement.split import layer_counts, layer_ranges

GIB = 1024**3
MAX_SUGGESTED_RANKS = 16


@dataclass(frozen=True)
class Refusal:
    """Why no placement works, with the numbers and what would."""

    check: str  # "heads", "architecture", "layers" or "memory": preflight's check name
    node: str  # "*" for the cluster as a whole
    found: str
    fix: str


@dataclass(frozen=True)
class _Model:
    config: ModelConfigInfo
    shape: ModelShape
    bytes_per_param: float
    context: int

    def layer_bytes(self, layer: int) -> float:
        return self.shape.layer_params[layer] * self.bytes_per_param

    @property
    def shared_bytes(self) -> float:
        return self.shape.shared_params * self.bytes_per_param

    def kv(self, layers: range) -> float:
        return kv_bytes(self.config, layers, self.context)


def place(spec: ClusterSpec, prints: Mapping[str, NodeFingerprint]) -> Placement | Refusal | None:
    """None when the model could not be read (preflight's model check reports that)."""
    model = _read_model(spec, prints)
    if model is None:
        return None
    sharing = ranks_on_machine(prints)
    budgets = _budgets(spec, prints, sharing)
    names = [node.name for node in spec.nodes]
    heads = _heads_divide(model.config, len(names))
    mode = spec.cluster.parallel
    if len(names) == 1 or (mode != "pipeline" and heads is None):
        tensor = _tensor(spec, model, names, budgets)
        over = _over_budget(tensor)
        if not over:
            tensor.reason = _tensor_reason(mode, len(names))
            return _kv_checked(tensor, model, spec)
        if mode == "tensor" or len(names) == 1:
            return _memory_refusal(tensor, over, model, sharing)
        why_not_tensor = f"tensor parallelism's equal shares do not fit {', '.join(over)}"
    elif mode == "tensor":
        assert heads is not None
        return Refusal(
            "heads",
            "*",
            heads,
            'set [cluster] parallel = "auto" or "pipeline" (any head count), or use '
            f"{_rank_counts(model.config)} nodes",
        )
    else:
        why_not_tensor = heads or "configured"
    model_type = model.config.model_type or "?"
    if not supports_pipeline(model_type):
        return Refusal(
            "architecture",
            "*",
            f"{why_not_tensor}, and mlx-lm cannot pipeline the {model_type!r} architecture",
            f"use {_rank_counts(model.config)} nodes for tensor parallelism, or a model of an "
            f"architecture that pipelines: {', '.join(sorted(pipeline_architectures()))}",
        )
    if len(model.shape.layer_params) < len(names):
        return Refusal(
            "layers",
            "*",
            f"{why_not_tensor}, and its {len(model.shape.layer_params)} layers cannot give "
            f"each of {len(names)} pipeline ranks one",
            f"use at most {len(model.shape.layer_params)} nodes",
        )
    pipeline = _pipeline(spec, model, names, budgets)
    pipeline.reason = why_not_tensor if mode == "auto" else "configured"
    over = _over_budget(pipeline)
    return _memory_refusal(pipeline, over, model, sharing) if over else _kv_checked(
        pipeline, model, spec)


def _kv_checked(placement: Placement, model: _Model, spec: ClusterSpec) -> Placement | Refusal:
    """The placement with each rank's KV budget, or why not one full sequence fits it."""
    short = fill_kv(placement, model.config, model.context, spec)
    if short is None:
        return placement
    return Refusal("memory", "*", short,
                   "raise [serving] kv_cache_gb, or lower [model] context_length")


def _read_model(spec: ClusterSpec, prints: Mapping[str, NodeFingerprint]) -> _Model | None:
    info: ModelInfo | None = prints[spec.nodes[0].name].model
    if info is None or not info.exists or info.config is None:
        return None
    try:
        shape = model_shape(info.config)
    except UnknownShape:
        return None
    # Scale the config's parameter count to the files' real size where it is known.
    per_param = (
        info.weight_bytes / shape.total_params
        if info.weight_bytes
        else bytes_per_param(info.config)
    )
    context = spec.model.context_length or info.config.max_position_embeddings or 4096
    return _Model(info.config, shape, per_param, context)


def _budgets(
    spec: ClusterSpec, prints: Mapping[str, NodeFingerprint], sharing: Mapping[str, int]
) -> list[float | None]:
    """What each rank may use: its node's usable memory less the reserve (split among the
    ranks sharing one machine), at most its memory_gb."""
    reserve = spec.preflight.reserve_memory_gb * GIB
    budgets: list[float | None] = []
    for node in spec.nodes:
        usable = prints[node.name].usable_memory_bytes()
        budget = None if usable is None else (usable - reserve) / sharing.get(node.name, 1)
        if node.memory_gb is not None:
            cap = node.memory_gb * GIB
            budget = cap if budget is None else min(budget, cap)
        budgets.append(budget)
    return budgets


def _heads_divide(config: ModelConfigInfo, ranks: int) -> str | None:
    """None when tensor parallelism can split the heads, else why not."""
    heads = config.num_attention_heads or 0
    kv_heads = config.num_key_value_heads or heads
    if heads % ranks == 0 and kv_heads % ranks == 0:
        return None
    return (f"the model's {heads} attention heads and {kv_heads} KV heads do not divide by "
            f"{ranks} ranks")


def _rank_counts(config: ModelConfigInfo) -> str:
    heads = config.num_attention_heads or 1
    common = math.gcd(heads, config.num_key_value_heads or heads)
    working = [n for n in range(1, min(common, MAX_SUGGESTED_RANKS) + 1) if common % n == 0]
    return " or ".join(map(str, working))


def _tensor(
    spec: ClusterSpec, model: _Model, names: list[str], budgets: Sequence[float | None]
) -> Placement:
    ranks = len(names)
    every_layer = range(len(model.shape.layer_params))
    layers = sum(model.layer_bytes(layer) for layer in every_layer)
    kv = kv_bytes(model.config, every_layer, model.context, tensor_ranks=ranks)
    # mlx-lm's shard() splits attention and MLPs; embeddings and head stay whole.
    weight = model.shared_bytes + layers / ranks
    return Placement(
        mode="tensor",
        reason="",
        ranks=[
            RankShare(rank=rank, node=name, weight_bytes=int(weight), kv_bytes=kv,
                      budget_bytes=_int(budgets[rank]))
            for rank, name in enumerate(names)
        ],
    )


def _pipeline(
    spec: ClusterSpec, model: _Model, names: list[str], budgets: Sequence[float | None]
) -> Placement:
    count = len(model.shape.layer_params)
    costs = [model.layer_bytes(i) + model.kv(range(i, i + 1)) for i in range(count)]
    known = [b for b in budgets if b is not None]
    fallback = sum(known) / len(known) if known else 1.0  # unknown memory: an average share
    room = [max((fallback if b is None else b) - model.shared_bytes, 1.0) for b in budgets]
    ranges = layer_ranges(layer_counts(costs, room))
    shares = [
        RankShare(
            rank=rank,
            node=name,
            layers=(span.start, span.stop),
            weight_bytes=int(model.shared_bytes + sum(model.layer_bytes(i) for i in span)),
            kv_bytes=int(model.kv(span)),
            budget_bytes=_int(budgets[rank]),
        )
        for rank, (name, span) in enumerate(zip(names, ranges, strict=True))
    ]
    return Placement(mode="pipeline", reason="", layer_count=count, ranks=shares)


def _over_budget(placement: Placement) -> list[str]:
    return [
        share.node
        for share in placement.ranks
        if share.budget_bytes is not None
        and share.weight_bytes + share.kv_bytes > share.budget_bytes
    ]


def _memory_refusal(
    placement: Placement, over: list[str], model: _Model, sharing: Mapping[str, int]
) -> Refusal:
    figures = "; ".join(
        f"{share.node} needs {_gib(share.weight_bytes)} weights + {_gib(share.kv_bytes)} KV, "
        f"may use {_gib(share.budget_bytes)}"
        + (f" ({sharing[share.node]} ranks share this machine)"
           if sharing.get(share.node, 1) > 1 else "")
        for share in placement.ranks
        if share.node in over
    )
    shared = any(sharing.get(node, 1) > 1 for node in over)
    total = model.shape.total_params * model.bytes_per_param
    four_bit = model.shape.total_params * (4 / 8 + 4 / 64)
    smaller = (
        f", or a 4-bit quantization (about {_gib(four_bit)} of weights)"
        if four_bit < total * 0.8
        else ""
    )
    other = (
        "pipeline (uneven nodes hold uneven shares)"
        if placement.mode == "tensor" and len(placement.ranks) > 1
        else "more nodes"
    )
    return Refusal(
        "memory",
        over[0] if len(over) == 1 else "*",
        f"in {placement.mode} mode the model ({_gib(total)} of weights) does not fit: "
        f"{figures}",
        ("run the ranks that share a machine on separate machines; " if shared else "")
        + f"use {other}, free memory or raise [[nodes]] memory_gb where it is set{smaller}",
    )


def _tensor_reason(mode: str, ranks: int) -> str:
    if ranks == 1:
        return "one rank"
    if mode == "tensor":
        return "configured"
    return "the heads divide by the rank count and every node holds an equal share"


def _int(value: float | None) -> int | None:
    return None if value is None else int(value)


def _gib(value: float | None) -> str:
    return "?" if value is None else f"{value / GIB:.1f} GiB"
