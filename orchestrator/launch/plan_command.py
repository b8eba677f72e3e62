"""`orchestrator plan` (and `up --dry-run`): connect to every node, take its fingerprint,
decide the placement as `up` would, and print the launch plan. Nothing is started.

With `--offline` nothing is connected to: the model is read at this machine or from the
hub (orchestrator/models/model_read.py), each node's memory is its memory_gb or
`--memory-gb NODE=GB` (a `local` node's is measured here: orchestrator/placement/
stand_in.py), and a node whose memory nothing gives stops the plan (exit 2, naming it).
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Mapping
from pathlib import Path

import msgspec

from contract.fingerprint import NodeFingerprint
from contract.placement import Placement
from orchestrator.config import ClusterSpec, ConfigErrors
from orchestrator.config.issues import ConfigIssue
from orchestrator.launch.plan import build_plan, plan_as_json, plan_as_toml
from orchestrator.models.hub import HubError
from orchestrator.models.model_read import ModelRead, read_model
from orchestrator.placement.decide import Refusal, place
from orchestrator.placement.kv_fit import fit_sentence
from orchestrator.placement.stand_in import (
    UnknownNodeName,
    measured_here,
    memory_source,
    stand_in_prints,
    unknown_memory,
    with_memory,
)
from orchestrator.transports.pool import NodePool

EXIT_OK, EXIT_REFUSED = 0, 2


def print_plan(spec: ClusterSpec, as_json: bool) -> int:
    prints, errors = asyncio.run(_fingerprints(spec))
    for error in errors:
        print(f"cannot reach node {error}", file=sys.stderr)
    if errors:
        return EXIT_REFUSED
    why = f"the model could not be read on {spec.nodes[0].name}: see `orchestrator up`'s preflight"
    return _decide_and_print(spec, prints, as_json, why)


def _decide_and_print(
    spec: ClusterSpec, prints: Mapping[str, NodeFingerprint], as_json: bool, undecided: str
) -> int:
    placement = place(spec, prints)
    if isinstance(placement, Refusal):
        print(f"[{placement.check}] {placement.node}: {placement.found}\n    fix: {placement.fix}",
              file=sys.stderr)
        return EXIT_REFUSED
    plan = build_plan(spec, "planned", prints, placement)
    print(plan_as_json(plan) if as_json else plan_as_toml(plan), end="")
    if placement is not None:
        print(fit_sentence(placement, spec.serving.max_batch_size), file=sys.stderr)
    else:
        print(f"placement: not decided ({undecided})", file=sys.stderr)
    return EXIT_OK


def print_offline_plan(
    spec: ClusterSpec, config: Path, as_json: bool, memory: Mapping[str, float]
) -> int:
    """The plan from the config alone: no node is connected to. Raises ConfigErrors (exit
    2) naming each node whose memory nothing gives, when the placement needs it."""
    try:
        spec = with_memory(spec, memory)
        read = read_model(spec.model)
    except UnknownNodeName as exc:
        raise ConfigErrors(config, [ConfigIssue("nodes", str(exc))]) from None
    except HubError as exc:
        print(f"{config}: model.path: {exc}", file=sys.stderr)
        return EXIT_REFUSED
    measured = measured_here(spec)
    if read.info is not None and (unknown := unknown_memory(spec, measured)):
        raise ConfigErrors(config, [_memory_issue(spec, name) for name in unknown])
    print(f"offline: no node was connected to; the model: {read.source}", file=sys.stderr)
    for node, source in memory_source(spec, measured, memory).items():
        print(f"  {node}: memory {source}", file=sys.stderr)
    undecided = (f"model.path: {read.source}; placement needs its config.json: point "
                 "model.path at a copy here, or at hf:ORG/NAME")
    return _decide_and_print(_located(spec, read), stand_in_prints(spec, read.info, measured),
                             as_json, undecided)


def _located(spec: ClusterSpec, read: ModelRead) -> ClusterSpec:
    """An hf: model as the nodes will hold it: its pinned snapshot, served under its NAME."""
    if read.path == spec.model.path:
        return spec
    model = msgspec.structs.replace(spec.model, path=read.path, id=spec.model.served_id)
    return msgspec.structs.replace(spec, model=model)


def _memory_issue(spec: ClusterSpec, name: str) -> ConfigIssue:
    index = next(i for i, node in enumerate(spec.nodes) if node.name == name)
    return ConfigIssue(
        f"nodes[{index}].memory_gb",
        f"node {name!r} sets no memory_gb, and offline nothing measures its memory (only "
        'this machine\'s, for transport = "local" nodes): placement needs it',
        f"set memory_gb = the GiB the model and its KV cache may use on {name}, or pass "
        f"--memory-gb {name}=GB",
    )


async def _fingerprints(spec: ClusterSpec) -> tuple[dict[str, NodeFingerprint], list[str]]:
    pool = NodePool(spec, on_event=lambda _node, _event: None, on_lost=lambda _n, _i: None)
    try:
        errors = await pool.connect_all()
        if errors:
            return {}, [f"{e.node} ({e.kind}): {e.message}" for e in errors]
        return await pool.fingerprint_all(), []
    finally:
        await pool.close_all()


def describe(placement: Placement, max_batch_size: int) -> str:
    """One line per rank for logs: the mode, why, each rank's share, and the KV's fit."""
    lines = [f"placement: {placement.mode} ({placement.reason})"]
    for share in placement.ranks:
        layers = f"layers [{share.layers[0]}, {share.layers[1]}) " if share.layers else ""
        lines.append(f"  rank {share.rank} on {share.node}: {layers}"
                     f"{share.weight_bytes / 1024**3:.2f} GiB of weights"
                     + (f", {share.kv_sequences} full-context sequences of KV"
                        if share.kv_sequences is not None else ""))
    lines.append(f"  {fit_sentence(placement, max_batch_size)}")
    return "\n".join(lines)
