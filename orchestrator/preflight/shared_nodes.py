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
    the nodes and the reserve). Nodes on one machine (one kernel boot id: network
    namespaces) count together."""
    machine = {node.name: _machine(node.name, prints.get(node.name)) for node in spec.nodes}
    needs: dict[str, list[tuple[str, str, int]]] = defaultdict(list)
    for name, (_, placement) in instances.items():
        for share in placement.ranks if placement else ():
            needs[machine.get(share.node, share.node)].append(
                (name, share.node, share.weight_bytes + share.kv_bytes))
    failures = []
    for users in needs.values():
        if len({instance for instance, _, _ in users}) < 2:
            continue
        nodes = sorted({node for _, node, _ in users})
        budget = _budget(spec, nodes, prints.get(nodes[0]))
        total = sum(size for _, _, size in users)
        if budget is None or total <= budget:
            continue
        parts = " + ".join(f"{name} {_size(size)}" for name, _, size in users)
        failures.append(PreflightFailure(
            ", ".join(nodes), "memory",
            f"the instances sharing it need {parts} = {_size(total)} (weights and "
            f"KV), more than the {_size(budget)} it may use",
            "move an instance to other nodes ([[instances]] nodes), serve a smaller model "
            "or a lower context_length, or free memory",
        ))
    return failures


def _size(size: float) -> str:
    """GiB to a tenth; a small model's share in MiB (0.0 GiB would hide the numbers)."""
    return f"{size / GIB:.1f} GiB" if size >= GIB else f"{size / 1024**2:.1f} MiB"


def _machine(node: str, fingerprint: NodeFingerprint | None) -> str:
    return fingerprint.boot_id if fingerprint and fingerprint.boot_id else node


def _budget(
    spec: ClusterSpec, nodes: list[str], fingerprint: NodeFingerprint | None
) -> float | None:
    """The machine's usable memory less the reserve; a lone node's memory_gb caps it."""
    usable = fingerprint.usable_memory_bytes() if fingerprint else None
    budget = None if usable is None else usable - spec.preflight.reserve_memory_gb * GIB
    caps = [n.memory_gb for n in spec.nodes if n.name in nodes and n.memory_gb is not None]
    if len(nodes) == 1 and caps:
        budget = caps[0] * GIB if budget is None else min(budget, caps[0] * GIB)
    return budget
