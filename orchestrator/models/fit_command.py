"""`orchestrator models --fit cluster.toml [MODEL ...]`: whether each model fits this cluster
before anything is downloaded: the mode, the weights per node, the memory left for KV and
how many full-context sequences it holds. MODEL is hf:ORG/NAME[@REV] (read from this
machine's cache, else the hub's config.json and file listing: no weight is fetched) or a
model directory here; none: the cluster's own model.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

import msgspec
from rich.table import Table
from rich.text import Text

from contract.model_ref import ModelRefError, parse_model_ref
from orchestrator.config import ClusterSpec, ConfigErrors
from orchestrator.config.issues import ConfigIssue
from orchestrator.console import report_console
from orchestrator.models.fit import Fit, fit_model
from orchestrator.models.hub import HubAccess, HubError
from orchestrator.models.model_read import read_model
from orchestrator.placement.stand_in import UnknownNodeName, measured_here, with_memory

EXIT_OK, EXIT_UNREADABLE, EXIT_USAGE = 0, 1, 2


@dataclass
class FitRow:
    model: str
    fits: str  # Fit.text(), or why the model could not be read
    source: str  # where its config was read
    fit: dict[str, object] | None = None  # the Fit's fields (--json)


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
    rows = [fit_row(spec, model) for model in models or [spec.model.path]]
    if as_json:
        print(msgspec.json.format(msgspec.json.encode([asdict(r) for r in rows])).decode())
    else:
        table = Table(box=None, pad_edge=False)
        for column in ("model", "fits", "read from"):
            table.add_column(column)
        for row in rows:
            table.add_row(*(Text(cell) for cell in (row.model, row.fits, row.source)))
        report_console().print(table)
    return EXIT_UNREADABLE if any(row.fit is None for row in rows) else EXIT_OK


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
