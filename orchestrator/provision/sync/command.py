"""`orchestrator sync cluster.toml [--from NODE] [--json]`: connect, sync, summarize.

Exit status: 0 every node holds the source's model; 1 a node failed (named, with its
fix); 2 nothing could start (no source, unreadable source, bundled model, config).
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import msgspec

from contract.placement import Placement
from orchestrator.config import ClusterSpec
from orchestrator.provision.sync.model_sync import (
    NodeOutcome,
    SyncError,
    SyncReport,
    local_manifest,
    local_source,
    sync_model,
)
from orchestrator.provision.sync.progress import (
    LogProgress,
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
            f"interrupted: nothing changed at {spec.model.path} on any node not yet done; "
            f"what arrived is staged, `orchestrator sync {config}` resumes",
            file=sys.stderr,
        )
        return EXIT_INTERRUPTED


async def _run(spec: ClusterSpec, config: Path, source: str | None, as_json: bool) -> int:
    hashed, started = 0, time.monotonic()
    if source is None:  # a missing or unreadable source fails before any connection
        try:
            hashed = (await local_manifest(local_source(spec)))[1]
        except SyncError as exc:
            print(f"sync: {exc}", file=sys.stderr)
            return EXIT_NOT_STARTED
    hash_seconds = time.monotonic() - started
    pool = NodePool(spec, on_event=lambda node, event: None, on_lost=lambda node, info: None)
    try:
        errors = await pool.connect_all()
        unreachable = {error.node: error.message for error in errors}
        if source in unreachable:
            print(f"cannot reach {source}, the sync source: {unreachable[source]}", file=sys.stderr)
            return EXIT_NOT_STARTED
        for name in unreachable:  # the others are synced; these are reported as failed
            del pool.nodes[name]
        progress: SyncProgress = QuietProgress() if as_json else RichProgress()
        try:
            report = await sync_model(spec, pool, progress, source, f"orchestrator sync {config}")
        except SyncError as exc:
            print(f"sync: {exc}", file=sys.stderr)
            return EXIT_NOT_STARTED
    finally:
        await pool.close_all()
    report.nodes += [_unreachable(name, message, config) for name, message in unreachable.items()]
    report.hashed_bytes += hashed  # the source was hashed above (sync_model found it cached)
    report.hash_seconds += hash_seconds
    print(as_json_text(report) if as_json else render(report))
    return EXIT_OK if report.ok else EXIT_NODE_FAILED


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
    data["ok"] = report.ok
    for node in data["nodes"]:
        seconds = node["transfer_seconds"]
        node["mb_per_s"] = round(node["sent_bytes"] / seconds / 1e6, 1) if seconds else None
    return data


def as_json_text(report: SyncReport) -> str:
    return msgspec.json.format(msgspec.json.encode(summary(report))).decode()


def render(report: SyncReport) -> str:
    head = (
        f"model {report.path} from {report.source}: {report.files} files, "
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


@dataclass
class UpSync:
    """What `up` with model.sync learns from the sync."""

    ok: bool  # every node holds its files (else reported: do not launch)
    # The pipeline split the nodes' shards were chosen for: `up` launches with this one
    # rather than deciding again (memory read moments later could move a boundary layer
    # onto a node that was not sent its shard).
    placement: Placement | None = None


async def sync_before_up(spec: ClusterSpec, pool: NodePool, config: Path) -> UpSync:
    """`up` with model.sync: sync over the pool's connections, log the outcome."""
    log = logging.getLogger("orchestrator.sync")
    try:
        report = await sync_model(
            spec, pool, LogProgress(), spec.model.sync_from, f"orchestrator sync {config}"
        )
    except SyncError as exc:
        log.error("model sync failed, nothing was launched: %s", exc)
        return UpSync(ok=False)
    for line in render(report).splitlines():
        (log.info if report.ok else log.error)("%s", line)
    return UpSync(ok=report.ok, placement=report.placement)
