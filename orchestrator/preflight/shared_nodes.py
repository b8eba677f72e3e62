"""A node carrying ranks of several instances: their weights and KV summed against it.

Each instance's own preflight weighs its ranks against the node alone; two instances on one
Mac would each fit and together not. This check adds up, per shared node, what every
instance about to launch places there (weights plus one full-context sequence of KV, as
placement estimates them) and refuses with the numbers when the sum exceeds what the node
may use (its usable memory less [preflight] reserve_memory_gb, at most its memory_gb).
An adopted instance is not counted: its memory is already in use, so already out of the
node's available memory.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping

from contract.fingerprint import NodeFingerprint
from contract.placement import Placement
from orchestrator.config import ClusterSpec
from orchestrator.preflight.failure import PreflightFailure

GIB = 1024**3


def shared_memory_failures(
    spec: ClusterSpec,
    instances: Mapping[str, tuple[ClusterSpec, Placement | None]],
    prints: Mapping[str, NodeFingerprint],
) -> list[PreflightFailure]:
    """`instances`: each instance's spec and placement, by name (the file's spec holds
    the nodes and the reserve)."""
    needs: dict[str, list[tuple[str, int]]] = defaultdict(list)  # node -> (instance, bytes)
    for name, (_, placement) in instances.items():
        for share in placement.ranks if placement else ():
            needs[share.node].append((name, share.weight_bytes + share.kv_bytes))
    failures = []
    for node in spec.nodes:
        users = needs.get(node.name, [])
        if len(users) < 2:
            continue
        budget = _budget(spec, node.name, prints.get(node.name))
        total = sum(size for _, size in users)
        if budget is None or total <= budget:
            continue
        parts = " + ".join(f"{name} {size / GIB:.1f} GiB" for name, size in users)
        failures.append(PreflightFailure(
            node.name, "memory",
            f"the instances sharing it need {parts} = {total / GIB:.1f} GiB (weights and "
            f"KV), more than the {budget / GIB:.1f} GiB it may use",
            "move an instance to other nodes ([[instances]] nodes), serve a smaller model "
            "or a lower context_length, or free memory",
        ))
    return failures


def _budget(spec: ClusterSpec, node: str, fingerprint: NodeFingerprint | None) -> float | None:
    usable = fingerprint.usable_memory_bytes() if fingerprint else None
    budget = None if usable is None else usable - spec.preflight.reserve_memory_gb * GIB
    cap = next((n.memory_gb for n in spec.nodes if n.name == node), None)
    if cap is not None:
        budget = cap * GIB if budget is None else min(budget, cap * GIB)
    return budget
