"""How a model would be placed on a cluster, for `orchestrator models cluster.toml` (its
fits column) and `models --fit`: the mode (tensor, pipeline, refused, or unknown while a
node's memory is), the weights per node, the memory left for KV and how many full-context
sequences it holds, and the largest context that fits, by the same decision `up` takes
(orchestrator/placement/decide.py) on the fingerprints `plan --offline` uses
(orchestrator/placement/stand_in.py).

Only this machine is probed (its `local` nodes); any other node's memory is its
`[[nodes]] memory_gb`, or unknown, and the answer says which.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import msgspec

from contract.fingerprint import ModelInfo, NodeFingerprint
from contract.model_config import config_info
from contract.placement import Placement
from orchestrator.config import ClusterSpec
from orchestrator.placement.decide import Refusal, place
from orchestrator.placement.stand_in import stand_in_prints, unknown_memory

GB = 1e9


@dataclass(frozen=True)
class Fit:
    mode: str  # "tensor", "pipeline", "refused" or "unknown" (a node's memory is unknown)
    weight_bytes: list[int]  # per node, in node order (empty unless it fits)
    max_context: int | None  # the largest context any placement fits (0: none); None: unknown
    why: str = ""  # a refusal's check and numbers; what is unknown
    assumed: tuple[str, ...] = ()  # nodes not probed: memory_gb, or unknown
    kv_room_bytes: tuple[int, ...] = ()  # per node: its budget less its weights
    context: int = 0  # the context placed: [model] context_length, else the model's limit
    sequences: int | None = None  # full-context sequences the KV room holds on every node

    def text(self) -> str:
        if self.mode in {"refused", "unknown"}:
            shown = f"{self.mode}: {self.why}"
        else:
            shown = f"{self.mode}, " + " + ".join(_gb(b) for b in self.weight_bytes)
            shown += " GB"
            if self.kv_room_bytes:
                shown += ", KV room " + " + ".join(_gb(b) for b in self.kv_room_bytes) + " GB"
            if self.sequences is not None:
                shown += f" for {self.sequences} sequences of {self.context} tokens"
        if self.max_context:
            shown += f", context ≤ {self.max_context}"
        if self.assumed and self.mode != "unknown":
            shown += f" ({', '.join(self.assumed)}: not probed, memory_gb)"
        return shown


def _gb(value: int) -> str:
    return f"{value / GB:.2f}" if value < 10 * GB else f"{value / GB:.0f}"


def fit(
    config: dict[str, object], weight_bytes: int, spec: ClusterSpec,
    probed: Mapping[str, NodeFingerprint], source: str = "config.json",
) -> Fit | None:
    """fit_model() of a config.json and its weights' size."""
    model = ModelInfo(spec="catalog", exists=True, kind="mlx_dir", weight_bytes=weight_bytes,
                      config=config_info(config, source))
    return fit_model(model, spec, probed)


def fit_model(model: ModelInfo, spec: ClusterSpec,
              probed: Mapping[str, NodeFingerprint]) -> Fit | None:
    """None when the config's shape cannot be read. `probed`: fingerprints of the nodes
    measured (this machine's); the others get memory_gb, or unknown memory."""
    prints = stand_in_prints(spec, model, probed)
    assumed = tuple(node.name for node in spec.nodes if node.name not in probed)
    decided = place(spec, prints)
    if decided is None:
        return None
    unknown = unknown_memory(spec, probed)
    if isinstance(decided, Refusal) and decided.check != "memory":
        return Fit("refused", [], None, f"{decided.check}: {decided.found}", assumed)
    if unknown:  # an unknown memory is no budget: place() would count it as unlimited
        return Fit("unknown", [], None,
                   f"the memory of {', '.join(unknown)} is not known: set its [[nodes]] "
                   "memory_gb, or pass --memory-gb NODE=GB",
                   assumed)
    limit = model.config.max_position_embeddings if model.config else None
    context = _largest_context(lambda c: place(_with_context(spec, c), prints), limit)
    if isinstance(decided, Refusal):
        return Fit("refused", [], context, f"{decided.check}: {decided.found}", assumed)
    return Fit(decided.mode, [share.weight_bytes for share in decided.ranks], context,
               assumed=assumed, kv_room_bytes=tuple(kv_room(decided)),
               context=spec.model.context_length or limit or 4096,  # as decide.py reads it
               sequences=full_context_sequences(decided))


def kv_room(placement: Placement) -> list[int]:
    """Per rank: what its budget leaves beside its weights (0 where the budget is unknown)."""
    return [max((share.budget_bytes or 0) - share.weight_bytes, 0) for share in placement.ranks]


def full_context_sequences(placement: Placement) -> int | None:
    """How many sequences of the placed context the KV budgets hold on every rank at once
    (set by the placement: orchestrator/placement/kv_fit.py, as admission counts them);
    None when no rank keeps a growing KV cache or a budget is unknown."""
    counts = [share.kv_sequences for share in placement.ranks]
    if any(share.budget_bytes is None for share in placement.ranks):
        return None
    known = [count for count in counts if count is not None]
    return min(known) if known else None


def _with_context(spec: ClusterSpec, context: int) -> ClusterSpec:
    return msgspec.structs.replace(
        spec, model=msgspec.structs.replace(spec.model, context_length=context))


def _largest_context(decide: Callable[[int], Placement | Refusal | None],
                     limit: int | None) -> int:
    """Binary search up to the model's own limit (0: none fits)."""
    low, high = 0, limit or 131072
    if isinstance(decide(high), Placement):
        return high
    while high - low > max(1, high // 1000):  # a tenth of a percent is close enough
        middle = (low + high) // 2
        if isinstance(decide(middle), Placement):
            low = middle
        else:
            high = middle
    return low
