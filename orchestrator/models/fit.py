"""How a model would be placed on a cluster, for `orchestrator models cluster.toml`: the
mode (tensor, pipeline or refused), the weights per node and the largest context that
fits, by the same decision `up` takes (orchestrator/placement/decide.py).

Only this machine is probed (its `local` nodes); any other node's memory is its
`[[nodes]] memory_gb`, or unknown, and the answer says which.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import msgspec

from contract.fingerprint import ModelInfo, NodeFingerprint, OsInfo, PythonInfo
from contract.model_config import config_info
from contract.placement import Placement
from orchestrator.config import ClusterSpec
from orchestrator.placement.decide import Refusal, place

GB = 1e9


@dataclass(frozen=True)
class Fit:
    mode: str  # "tensor", "pipeline" or "refused"
    weight_bytes: list[int]  # per node, in node order (empty when refused)
    max_context: int | None  # the largest context any placement fits (0: none); None: unknown
    why: str = ""  # a refusal's check and numbers
    assumed: tuple[str, ...] = ()  # nodes not probed: memory_gb, or unknown

    def text(self) -> str:
        if self.mode == "refused":
            shown = f"refused: {self.why}"
        else:
            shown = f"{self.mode}, " + " + ".join(_gb(b) for b in self.weight_bytes)
            shown += " GB"
        if self.max_context:
            shown += f", context ≤ {self.max_context}"
        if self.assumed:
            shown += f" ({', '.join(self.assumed)}: not probed, memory_gb)"
        return shown


def _gb(value: int) -> str:
    return f"{value / GB:.2f}" if value < 10 * GB else f"{value / GB:.0f}"


def fit(
    config: dict[str, object], weight_bytes: int, spec: ClusterSpec,
    probed: Mapping[str, NodeFingerprint], source: str = "config.json",
) -> Fit | None:
    """None when the config's shape cannot be read. `probed`: fingerprints of the nodes
    measured (this machine's); the others get memory_gb, or unknown memory."""
    model = ModelInfo(spec="catalog", exists=True, kind="mlx_dir", weight_bytes=weight_bytes,
                      config=config_info(config, source))
    # A node not probed gets no measured memory: its budget is then memory_gb exactly.
    prints = {node.name: _fingerprint(probed.get(node.name), model) for node in spec.nodes}
    assumed = tuple(node.name for node in spec.nodes if node.name not in probed)
    decided = place(spec, prints)
    if decided is None:
        return None
    known = bool(probed) or any(node.memory_gb for node in spec.nodes)
    limit = model.config.max_position_embeddings if model.config else None
    context = (_largest_context(lambda c: place(_with_context(spec, c), prints), limit)
               if known else None)
    if isinstance(decided, Refusal):
        return Fit("refused", [], context, f"{decided.check}: {decided.found}", assumed)
    return Fit(decided.mode, [share.weight_bytes for share in decided.ranks], context,
               assumed=assumed)


def _fingerprint(probed: NodeFingerprint | None, model: ModelInfo) -> NodeFingerprint:
    if probed is not None:
        return msgspec.structs.replace(probed, model=model)
    return NodeFingerprint(
        hostname="?",
        os=OsInfo(system="?", name="?", version="?", kernel="?"),
        arch="?",
        python=PythonInfo(version="?", executable="?", implementation="?"),
        model=model,
    )


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
