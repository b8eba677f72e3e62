"""Forwarding along the ring ([model] sync_forwarding): the head sends the model once.

    head ══SFTP══▶ node 0 ──verified──▶ node 1 fetches from node 0 ──verified──▶ node 2 …
                 (model_sync's push)    (ModelServe on node 0's address on their cable,
                                         ModelFetch on node 1, ModelFinalize: the manifest
                                         check of this hop)

Nodes in config order (the ring's order). A node forwards only once its own copy is
verified and holds every file the next one needs (pipeline subsets may differ); a hop
that fails (a corrupt byte at the holder, a cable down) falls back to the head pushing
that node, and the chain goes on from whichever node holds a verified copy.
"""

from __future__ import annotations

import contextlib
import logging
import secrets
import time
from collections.abc import Awaitable, Callable

from contract.model_manifest import (
    FetchFile,
    FileRange,
    ModelFetch,
    ModelFetched,
    ModelFinalize,
    ModelFinalized,
    ModelPrefixHash,
    ModelPrepare,
    ModelPrepared,
    ModelServe,
    ModelServing,
    PrefixHashes,
)
from orchestrator.config import ClusterSpec
from orchestrator.provision.sync.state import NodeOutcome, SyncContext, agent_error, resumable
from orchestrator.provision.sync.transfer import HASH_TIMEOUT_S, RESUME_WINDOW
from orchestrator.transports.errors import AgentRequestError, TransportError
from orchestrator.transports.handle import AgentHandle
from orchestrator.transports.pool import NodeConnection

log = logging.getLogger("orchestrator.sync")
Push = Callable[[SyncContext, NodeConnection], Awaitable[NodeOutcome]]
SERVE_TIMEOUT_S = 30.0


def hop_address(spec: ClusterSpec, holder: str, receiver: str) -> str:
    """Where receiver reaches holder: holder's address on a cable between them ([[links]]),
    else holder's SSH host (127.0.0.1 for a local node)."""
    for link in spec.links:
        if set(link.between) == {holder, receiver} and link.ips:
            return link.ips[link.between.index(holder)]
    node = next(n for n in spec.nodes if n.name == holder)
    return node.ssh_host or "127.0.0.1"


def _covers(ctx: SyncContext, holder: str, receiver: str) -> bool:
    have = {(f.path, f.sha256) for f in ctx.subsets.manifest(holder, ctx.manifest).files}
    need = ctx.subsets.manifest(receiver, ctx.manifest).files
    return all((f.path, f.sha256) in have for f in need)


async def chain(ctx: SyncContext, targets: list[NodeConnection], push: Push) -> list[NodeOutcome]:
    """Every target in turn: from the last node holding a verified copy, else pushed."""
    outcomes: list[NodeOutcome] = []
    holder: str | None = None
    for node in targets:
        name = node.spec.name
        if holder is not None and _covers(ctx, holder, name):
            outcome = await _forward(ctx, holder, node)
            if outcome.status == "failed":
                log.info("[%s] forwarding from %s failed: %s", name, holder, outcome.error)
                error = outcome.error
                outcome = await push(ctx, node)
                outcome.forward_error = error
        else:
            outcome = await push(ctx, node)
        if outcome.status in ("synced", "current"):
            holder = name
        outcomes.append(outcome)
    return outcomes


class _HolderPrefix:
    """The holder's prefix hashes, to check a receiver's partial files before resuming."""

    def __init__(self, agent: AgentHandle, path: str) -> None:
        self._agent, self._path = agent, path

    async def prefix_sha256(self, ranges: list[FileRange]) -> list[str]:
        request = ModelPrefixHash(path=self._path, ranges=ranges)
        return (await self._agent.request(request, PrefixHashes, HASH_TIMEOUT_S)).sha256


async def _forward(ctx: SyncContext, holder: str, node: NodeConnection) -> NodeOutcome:
    name = node.spec.name
    manifest = ctx.subsets.manifest(name, ctx.manifest)
    outcome = NodeOutcome(name, "failed", need_bytes=manifest.total_bytes)
    outcome.layers = ctx.subsets.layers.get(name)
    started = time.monotonic()
    try:
        agent = ctx.pool.agent(name)
        prepare = ModelPrepare(
            path=ctx.spec.model.path, manifest=manifest, resume_window=RESUME_WINDOW
        )
        prepared = await agent.request(prepare, ModelPrepared, HASH_TIMEOUT_S)
        outcome.hashed_bytes = prepared.hashed_bytes
        if prepared.current:
            outcome.status = "current"
            ctx.progress.done(name, "already current")
            return outcome
        outcome.reused_bytes = prepared.reused_bytes
        holder_agent = ctx.pool.agent(holder)
        send = await resumable(_HolderPrefix(holder_agent, ctx.spec.model.path), prepared.send)
        outcome.resumed_bytes = prepared.staged_bytes + sum(f.offset for f in send)
        sizes = {f.path: f.size for f in manifest.files}
        files = [FetchFile(path=f.path, offset=f.offset, size=sizes[f.path]) for f in send]
        ctx.progress.start(name, sum(f.size - f.offset for f in files))
        transfer_started = time.monotonic()
        outcome.sent_bytes = await _fetch(ctx, holder_agent, agent, prepared.staging, files)
        ctx.progress.advance(name, outcome.sent_bytes)
        outcome.transfer_seconds = time.monotonic() - transfer_started
        finalize = ModelFinalize(path=ctx.spec.model.path, manifest=manifest)
        finalized = await agent.request(finalize, ModelFinalized, HASH_TIMEOUT_S)
        outcome.hashed_bytes += finalized.hashed_bytes
        outcome.status, outcome.forwarded_from = "synced", holder
        ctx.progress.done(name, f"verified (from {holder})")
    except (AgentRequestError, TransportError) as exc:
        outcome.error = agent_error(exc, ctx.rerun)
    except Exception as exc:  # a timeout, or a bug: the head pushes this node instead
        log.debug("[%s] forwarding failed", name, exc_info=True)
        outcome.error = f"{type(exc).__name__}: {exc}"
    outcome.seconds = time.monotonic() - started
    return outcome


async def _fetch(
    ctx: SyncContext,
    holder: AgentHandle,
    receiver: AgentHandle,
    staging: str,
    files: list[FetchFile],
) -> int:
    """The holder serves files for this one transfer (its own token); the receiver fetches."""
    host = hop_address(ctx.spec, holder.node, receiver.node)
    token = secrets.token_hex(32)
    serve = ModelServe(
        path=ctx.spec.model.path, host=host, token=token, files=[f.path for f in files]
    )
    serving = await holder.request(serve, ModelServing, SERVE_TIMEOUT_S)
    try:
        fetch = ModelFetch(staging=staging, host=host, port=serving.port, token=token, files=files)
        return (await receiver.request(fetch, ModelFetched, HASH_TIMEOUT_S)).received_bytes
    finally:
        with contextlib.suppress(Exception):
            await holder.request(ModelServe(token=token, close=True), ModelServing, SERVE_TIMEOUT_S)
