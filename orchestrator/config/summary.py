"""The one-screen summary `orchestrator validate` prints for a valid cluster.toml."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from orchestrator.config.api_auth import describe_auth, unset_key_issue
from orchestrator.config.instances import instance_specs
from orchestrator.config.issues import ConfigIssue
from orchestrator.config.links import rank_addresses
from orchestrator.config.spec import ClusterSpec


def summarize(
    spec: ClusterSpec,
    warnings: list[ConfigIssue],
    source: Path,
    environ: Mapping[str, str] = os.environ,
) -> str:
    api_auth = describe_auth(spec, environ)
    refusal = unset_key_issue(spec, environ)  # this shell's view: `up` may run in another
    if refusal is not None:
        warnings = [*warnings, refusal]
    lines = [
        f"{source}: valid",
        f"  cluster   {spec.cluster.name}: {spec.cluster.backend} backend, "
        f"{spec.world_size} rank{'s' if spec.world_size != 1 else ''} ({_mode(spec)})",
        f"  model     {spec.model.path} (served as {spec.model.served_id!r})",
        f"  api       http://{spec.api.host}:{spec.api.port}/v1 ({api_auth})",
        "",
        f"  {'rank':<5} {'node':<16} {'transport':<10} {'address':<22} python",
    ]
    for rank, (node, addresses) in enumerate(zip(spec.nodes, rank_addresses(spec), strict=True)):
        where = node.ssh if node.transport == "ssh" else "this machine"
        port = spec.cluster.rank_port + rank
        address = ", ".join(f"{a.ip}:{port}" for a in addresses)
        lines.append(
            f"  {rank:<5} {node.name:<16} {node.transport:<10} {address:<22} "
            f"{node.python_executable} ({where})"
        )
    lines += _instances(spec)
    if warnings:
        lines += ["", "warnings:"]
        lines += ["  " + warning.render(source) for warning in warnings]
    return "\n".join(lines)


def _instances(spec: ClusterSpec) -> list[str]:
    """Each [[instances]] table: its model, id and aliases, nodes, ports (the file's own
    [model] line above then serves no instance)."""
    if not spec.instances:
        return []
    lines = ["", f"  {'instance':<12} {'serves':<28} {'nodes':<24} ports (ranks, rank 0 API)"]
    for name, derived in instance_specs(spec).items():
        model = derived.model
        serves = ", ".join([model.served_id, *model.aliases])
        nodes = ", ".join(node.name for node in derived.nodes)
        first = derived.cluster.rank_port
        ranks = f"{first}-{first + derived.world_size - 1}" if derived.world_size > 1 else first
        lines.append(f"  {name:<12} {serves:<28} {nodes:<24} {ranks}, "
                     f"{derived.serving.rank_api_port}   {model.path}")
    return lines


def _mode(spec: ClusterSpec) -> str:
    """The parallelism as far as the file decides it; `auto` is decided by `plan` and `up`
    from the model's heads and the nodes' memory, which validate does not read."""
    if spec.world_size == 1:
        return "one rank, the whole model"
    if spec.cluster.parallel == "auto":
        return "tensor or pipeline parallel: `orchestrator plan` decides from the model"
    return f"{spec.cluster.parallel} parallel"
