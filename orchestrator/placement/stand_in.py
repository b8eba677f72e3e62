"""Each node's fingerprint as the config tells it, for placing without connecting
(`plan --offline`, `up --dry-run --offline`, `models --fit`).

A node's memory is what placement needs from a probe. Without one it comes from:

    memory_gb (cluster.toml, or --memory-gb NODE=GB)  the node's budget, exactly
    a `local` node without it                         this machine, measured here
    an `ssh` node without it                          unknown: never counted as unlimited

Where memory_gb is set it stands in for the node even when the node is local: the plan may
be drawn on another machine than the one `up` will run on.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping

import msgspec

from contract.fingerprint import ModelInfo, NodeFingerprint, OsInfo, PythonInfo
from orchestrator.config import ClusterSpec

MEMORY_FIELD = "memory_gb"


class UnknownNodeName(ValueError):
    """--memory-gb names a node the config does not have."""


def with_memory(spec: ClusterSpec, given: Mapping[str, float]) -> ClusterSpec:
    """The spec with the command line's memory per node in place of [[nodes]] memory_gb."""
    names = {node.name for node in spec.nodes}
    if unknown := sorted(set(given) - names):
        raise UnknownNodeName(
            f"--memory-gb names {', '.join(unknown)}, not a node of this cluster "
            f"(its nodes: {', '.join(node.name for node in spec.nodes)})")
    nodes = [msgspec.structs.replace(node, memory_gb=given[node.name])
             if node.name in given else node for node in spec.nodes]
    return msgspec.structs.replace(spec, nodes=nodes)


def measured_here(spec: ClusterSpec) -> dict[str, NodeFingerprint]:
    """This machine's fingerprint for each of the cluster's `local` nodes (none else)."""
    local = [node.name for node in spec.nodes if node.transport == "local"]
    return dict.fromkeys(local, _probe_here()) if local else {}


@functools.cache
def _probe_here() -> NodeFingerprint:
    from node_agent.fingerprint import collect_fingerprint  # only when a local node asks

    return collect_fingerprint(None, None)


def stand_in_prints(
    spec: ClusterSpec, model: ModelInfo | None, measured: Mapping[str, NodeFingerprint]
) -> dict[str, NodeFingerprint]:
    """Every node's fingerprint for placement, carrying `model`: the measured one where
    there is one (its memory dropped where memory_gb stands in), else a blank one whose
    budget is its memory_gb, or unknown."""
    prints = {}
    for node in spec.nodes:
        probed = measured.get(node.name)
        if probed is None:
            prints[node.name] = _blank(model)
        elif node.memory_gb is not None:
            prints[node.name] = msgspec.structs.replace(probed, model=model, memory=None)
        else:
            prints[node.name] = msgspec.structs.replace(probed, model=model)
    return prints


def unknown_memory(spec: ClusterSpec, measured: Mapping[str, NodeFingerprint]) -> list[str]:
    """The nodes whose memory neither memory_gb nor a measurement gives."""
    return [
        node.name
        for node in spec.nodes
        if node.memory_gb is None
        and (node.name not in measured or measured[node.name].memory is None)
    ]


def memory_source(spec: ClusterSpec, measured: Mapping[str, NodeFingerprint],
                  given: Mapping[str, float]) -> dict[str, str]:
    """Where each node's memory came from, for the operator."""
    sources = {}
    for node in spec.nodes:
        if node.name in given:
            sources[node.name] = f"{node.memory_gb:g} GiB from --memory-gb"
        elif node.memory_gb is not None:
            sources[node.name] = f"{node.memory_gb:g} GiB from {MEMORY_FIELD}"
        elif node.name in measured and measured[node.name].memory is not None:
            sources[node.name] = "measured at this machine (transport = \"local\")"
        else:
            sources[node.name] = "unknown"
    return sources


def _blank(model: ModelInfo | None) -> NodeFingerprint:
    """A node not measured: no memory, no boot id (its budget is memory_gb exactly)."""
    return NodeFingerprint(
        hostname="?",
        os=OsInfo(system="?", name="?", version="?", kernel="?"),
        arch="?",
        python=PythonInfo(version="?", executable="?", implementation="?"),
        model=model,
    )
