"""`orchestrator models --fit cluster.toml [MODEL ...]`: whether each model fits this cluster
before anything is downloaded: the mode, the weights per node, the memory left for KV and
how many full-context sequences it holds. MODEL is hf:ORG/NAME[@REV] (read from this
machine's cache, else the hub's config.json and file listing: no weight is fetched) or a
model directory here; none: the cluster's own model.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path

import msgspec
from rich.table import Table
from rich.text import Text

from contract.fingerprint import NodeFingerprint
from contract.model_ref import ModelRefError, parse_model_ref
from contract.placement import Placement
from orchestrator.config import ClusterSpec, ConfigErrors
from orchestrator.config.instances import instance_specs
from orchestrator.config.issues import ConfigIssue
from orchestrator.console import report_console
from orchestrator.models.fit import Fit, fit_model
from orchestrator.models.hub import HubAccess, HubError
from orchestrator.models.model_read import read_model
from orchestrator.placement.decide import place
from orchestrator.placement.stand_in import (
    UnknownNodeName,
    measured_here,
    stand_in_prints,
    with_memory,
)
from orchestrator.preflight.shared_nodes import shared_memory_failures

EXIT_OK, EXIT_UNREADABLE, EXIT_USAGE = 0, 1, 2


@dataclass
class FitRow:
    model: str
    fits: str  # Fit.text(), or why the model could not be read
    source: str  # where its config was read
    fit: dict[str, object] | None = None  # the Fit's fields (--json)
    instance: str = ""  # with [[instances]]: the instance serving it, on these nodes
    nodes: list[str] = field(default_factory=list)


def fit_command(spec: ClusterSpec, config: Path, models: list[str], as_json: bool,
                memory: Mapping[str, float]) -> int:
    for model in models:
        try:
            parse_model_ref(model)
        except ModelRefError as exc:
            print(f"models --fit: {model!r}: {exc}", file=sys.stderr)
            return EXIT_USAGE
    try:
        spec = with_memory(spec, memory)
    except UnknownNodeName as exc:
        raise ConfigErrors(config, [ConfigIssue("nodes", str(exc))]) from None
    shared: list[str] = []
    if spec.instances and not models:  # each instance on its own nodes, then their sum
        rows, shared = instance_fit_rows(spec)
    else:
        rows = [fit_row(spec, model) for model in models or [spec.model.path]]
    _show(rows, shared, as_json, bool(spec.instances and not models))
    if any(row.fit is None for row in rows) or shared:
        return EXIT_UNREADABLE
    return EXIT_OK


def _fields(row: FitRow, instances: bool) -> dict[str, object]:
    data = asdict(row)
    if not instances:  # a file without [[instances]]: the fields it always had
        del data["instance"], data["nodes"]
    return data


def _show(rows: list[FitRow], shared: list[str], as_json: bool, instances: bool) -> None:
    if as_json:
        data: object = [_fields(r, instances) for r in rows]
        if instances:
            data = {"instances": data, "shared_nodes_refused": shared}
        print(msgspec.json.format(msgspec.json.encode(data)).decode())
        return
    table = Table(box=None, pad_edge=False)
    for column in (["instance", "nodes"] if instances else []) + ["model", "fits", "read from"]:
        table.add_column(column)
    for row in rows:
        cells = [row.instance, ", ".join(row.nodes)] if instances else []
        table.add_row(*(Text(cell) for cell in [*cells, row.model, row.fits, row.source]))
    report_console().print(table)
    for line in shared:
        print(line, file=sys.stderr)


def fit_row(spec: ClusterSpec, model: str, access: HubAccess | None = None) -> FitRow:
    """One model on this cluster; the cluster's [model] settings (store, context_length,
    trust_remote_code) apply to it."""
    settings = msgspec.structs.replace(spec.model, path=model)
    try:
        read = read_model(settings, access)
    except HubError as exc:
        return FitRow(model, f"not read: {exc}", "the hub")
    if read.info is None:
        return FitRow(model, "not read", read.source)
    decided: Fit | None = fit_model(read.info, _with_model(spec, model), measured_here(spec))
    if decided is None:
        return FitRow(model, "? (its config gives no shape)", read.source)
    return FitRow(model, decided.text(), read.source, asdict(decided))


def _with_model(spec: ClusterSpec, model: str) -> ClusterSpec:
    return msgspec.structs.replace(spec, model=msgspec.structs.replace(spec.model, path=model))


# `models --fit cluster.toml` of a file with `[[instances]]`: each instance's model on its
# own nodes (fit_row on the instance's spec), then each node the instances share, their
# weights and KV summed against it by the check `up`'s preflight runs
# (orchestrator/preflight/shared_nodes.py), on the same stand-in fingerprints.
def instance_fit_rows(
    spec: ClusterSpec, access: HubAccess | None = None
) -> tuple[list[FitRow], list[str]]:
    """(a row per instance, the shared nodes that do not fit: each a rendered failure)."""
    rows: list[FitRow] = []
    placed: dict[str, tuple[ClusterSpec, Placement | None]] = {}
    prints: dict[str, NodeFingerprint] = {}
    for name, one in instance_specs(spec).items():
        row = fit_row(one, one.model.path, access)
        row.instance, row.nodes = name, [node.name for node in one.nodes]
        rows.append(row)
        try:
            read = read_model(one.model, access)
        except HubError:
            continue  # the row says why
        if read.info is None:
            continue
        stand_ins = stand_in_prints(one, read.info, measured_here(one))
        decided = place(one, stand_ins)
        if isinstance(decided, Placement):
            placed[name] = (one, decided)
            prints.update(stand_ins)
    return rows, [failure.render() for failure in shared_memory_failures(spec, placed, prints)]
