"""`orchestrator plan` (and `up --dry-run`): connect to every node, take its fingerprint,
decide the placement as `up` would, and print the launch plan. Nothing is started.

With `[[instances]]`, each instance's plan (its placement, ranks, its own port block and
env) under `[[instances]]` (`--json`: {"instances": [...]}), each keyed by `instance`,
then the memory of each node the instances share summed as `up`'s preflight does.

With `--offline` nothing is connected to: the model is read at this machine or from the
hub (orchestrator/models/model_read.py), each node's memory is its memory_gb or
`--memory-gb NODE=GB` (a `local` node's is measured here: orchestrator/placement/
stand_in.py), and a node whose memory nothing gives stops the plan (exit 2, naming it).
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable, Mapping
from pathlib import Path

import msgspec

from contract.fingerprint import NodeFingerprint
from contract.placement import Placement
from orchestrator.config import ClusterSpec, ConfigErrors
from orchestrator.config.instances import instance_specs
from orchestrator.config.issues import ConfigIssue
from orchestrator.launch.plan import (
    LaunchPlan,
    build_plan,
    instance_plans_text,
    plan_as_json,
    plan_as_toml,
)
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
from orchestrator.preflight.shared_nodes import shared_memory_failures
from orchestrator.transports.pool import NodePool

EXIT_OK, EXIT_REFUSED = 0, 2


# What one instance's plan is decided from: its spec as planned, the nodes' fingerprints
# (probed or stood in), and why the placement may stay undecided.
Planned = tuple[ClusterSpec, Mapping[str, NodeFingerprint], str]


def print_plan(spec: ClusterSpec, as_json: bool) -> int:
    return _print_all(spec, as_json, _online)


def _online(spec: ClusterSpec) -> Planned | int:
    prints, errors = asyncio.run(_fingerprints(spec))
    for error in errors:
        print(f"cannot reach node {error}", file=sys.stderr)
    if errors:
        return EXIT_REFUSED
    why = f"the model could not be read on {spec.nodes[0].name}: see `orchestrator up`'s preflight"
    return spec, prints, why


def _print_all(
    spec: ClusterSpec, as_json: bool, gather: Callable[[ClusterSpec], Planned | int]
) -> int:
    """Every instance's plan (the file's one without [[instances]]), then, with several,
    the memory of each node they share summed (orchestrator/preflight/shared_nodes.py)."""
    plans: list[tuple[str, LaunchPlan]] = []
    placed: dict[str, tuple[ClusterSpec, Placement | None]] = {}
    every: dict[str, NodeFingerprint] = {}
    notes: list[str] = []
    for name, one in instance_specs(spec).items():
        tag = f"instance {name}: " if name else ""
        if name:
            print(f"instance {name}:", file=sys.stderr)
        got = gather(one)
        if isinstance(got, int):
            return got
        planned, prints, undecided = got
        placement = place(planned, prints)
        if isinstance(placement, Refusal):
            print(f"{tag}[{placement.check}] {placement.node}: {placement.found}\n"
                  f"    fix: {placement.fix}", file=sys.stderr)
            return EXIT_REFUSED
        plans.append((name, build_plan(planned, "planned", prints, placement)))
        placed[name], every = (planned, placement), {**every, **prints}
        notes.append(tag + (fit_sentence(placement, planned.serving.max_batch_size)
                            if placement else f"placement: not decided ({undecided})"))
    if not spec.instances:
        plan = plans[0][1]
        print(plan_as_json(plan) if as_json else plan_as_toml(plan), end="")
    else:
        print(instance_plans_text(plans, as_json), end="")
    for note in notes:
        print(note, file=sys.stderr)
    if not spec.instances:
        return EXIT_OK
    failures = shared_memory_failures(spec, placed, every)
    for failure in failures:
        print(failure.render(), file=sys.stderr)
    return EXIT_REFUSED if failures else EXIT_OK


def print_offline_plan(
    spec: ClusterSpec, config: Path, as_json: bool, memory: Mapping[str, float]
) -> int:
    """The plan from the config alone: no node is connected to. Raises ConfigErrors (exit
    2) naming each node whose memory nothing gives, when the placement needs it."""
    try:
        spec = with_memory(spec, memory)
    except UnknownNodeName as exc:
        raise ConfigErrors(config, [ConfigIssue("nodes", str(exc))]) from None
    return _print_all(spec, as_json, lambda one: _offline(one, config, memory))


def _offline(spec: ClusterSpec, config: Path, memory: Mapping[str, float]) -> Planned | int:
    """One instance's stand-in fingerprints; its model read here or from the hub."""
    try:
        read = read_model(spec.model)
    except HubError as exc:
        print(f"{config}: model.path: {exc}", file=sys.stderr)
        return EXIT_REFUSED
    measured = measured_here(spec)
    if read.info is not None and (unknown := unknown_memory(spec, measured)):
        raise ConfigErrors(config, [_memory_issue(spec, name) for name in unknown])
    print(f"offline: no node was connected to; the model: {read.source}", file=sys.stderr)
    mine = {node: gb for node, gb in memory.items() if node in {n.name for n in spec.nodes}}
    for node, source in memory_source(spec, measured, mine).items():
        print(f"  {node}: memory {source}", file=sys.stderr)
    undecided = (f"model.path: {read.source}; placement needs its config.json: point "
                 "model.path at a copy here, or at hf:ORG/NAME")
    return _located(spec, read), stand_in_prints(spec, read.info, measured), undecided


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
