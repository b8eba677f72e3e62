"""Forwarding along the ring ([model] sync_forwarding): the head sends the model once.

    head ══TLS/SFTP══▶ node 0 ──file verified──▶ node 1 fetches it from node 0 ──▶ node 2 …
                       (model_sync's push)        (ModelServe on node 0's address on their
                                                   cable, ModelFetch per file on node 1,
                                                   ModelFinalize: this hop's manifest check)

Nodes in config order (the ring's order), all at once: node k fetches each file from
node k-1 as soon as node k-1 holds it verified (its staging directory, or its copy once
renamed), while node k-1 still receives the next file, so hops overlap instead of
running one whole copy after another. A node forwards only when its files cover the
next one's (pipeline subsets may differ); a hop that fails (a corrupt byte at the
holder, a cable down, the holder failing) falls back to the head pushing that node.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets

from contract.model_manifest import (
    FetchFile,
    FileRange,
    FileToSend,
    ModelFetch,
    ModelFetched,
    ModelPrefixHash,
    ModelServe,
    ModelServing,
    PrefixHashes,
)
from orchestrator.config import ClusterSpec
from orchestrator.provision.sync.pipeline import Delivery, each_file, sync_node
from orchestrator.provision.sync.push import push_node
from orchestrator.provision.sync.state import (
    NodeOutcome,
    SyncContext,
    resumable,
    verify_arrived,
)
from orchestrator.provision.sync.transfer import HASH_TIMEOUT_S
from orchestrator.transports.handle import AgentHandle
from orchestrator.transports.pool import NodeConnection

log = logging.getLogger("orchestrator.sync")
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


class _Held:
    """What one node holds verified so far, for the next node to fetch."""

    def __init__(self, paths: list[str]) -> None:
        self.files = {path: asyncio.Event() for path in paths}
        self.gone = asyncio.Event()  # its sync failed: nothing more will come
        self.done = asyncio.Event()  # its copy is verified and in place

    def mark(self, path: str) -> None:
        if path in self.files:
            self.files[path].set()

    async def wait(self, path: str | None = None) -> bool:
        """True once path (None: the whole copy, in place) is verified there; False when
        that node failed first."""
        event = self.done if path is None else self.files[path]
        ready = asyncio.ensure_future(event.wait())
        failed = asyncio.ensure_future(self.gone.wait())
        await asyncio.wait({ready, failed}, return_when=asyncio.FIRST_COMPLETED)
        ready.cancel()
        failed.cancel()
        return event.is_set()


async def chain(ctx: SyncContext, targets: list[NodeConnection]) -> list[NodeOutcome]:
    """Every target at once: the first pushed, each next fetching from its predecessor
    file by file as they are verified there (else pushed)."""
    held = {
        name: _Held([f.path for f in ctx.subsets.manifest(name, ctx.manifest).files])
        for name in (node.spec.name for node in targets)
    }
    ctx.verified = lambda node, path: held[node].mark(path) if node in held else None
    ctx.parallel_files = 1

    async def one(k: int, node: NodeConnection) -> NodeOutcome:
        name = node.spec.name
        holder = targets[k - 1].spec.name if k else None
        if holder is not None and _covers(ctx, holder, name):
            outcome = await sync_node(ctx, node, _Hop(ctx, holder, held[holder]))
            if outcome.status == "failed":
                log.info("[%s] forwarding from %s failed: %s", name, holder, outcome.error)
                error = outcome.error
                outcome = await push_node(ctx, node)
                outcome.forward_error = error
        else:
            outcome = await push_node(ctx, node)
        if outcome.status == "failed":
            held[name].gone.set()
        else:
            for path in held[name].files:
                held[name].mark(path)
            held[name].done.set()
        return outcome

    return list(await asyncio.gather(*(one(k, node) for k, node in enumerate(targets))))


class _HolderPrefix:
    """The holder's prefix hashes, to check a receiver's partial files before resuming."""

    def __init__(self, agent: AgentHandle, path: str) -> None:
        self._agent, self._path = agent, path

    async def prefix_sha256(self, ranges: list[FileRange]) -> list[str]:
        request = ModelPrefixHash(path=self._path, ranges=ranges)
        return (await self._agent.request(request, PrefixHashes, HASH_TIMEOUT_S)).sha256


class _Hop:
    """The pipeline's transfer from the node's predecessor: each file fetched from the
    holder once it holds it verified."""

    def __init__(self, ctx: SyncContext, holder: str, holding: _Held) -> None:
        self._ctx, self.holder, self._holding = ctx, holder, holding

    async def resume(self, send: list[FileToSend]) -> list[FileToSend]:
        if not any(f.offset for f in send):
            return send
        # The holder's prefixes: once its copy is in place.
        if not await self._holding.wait():
            raise RuntimeError(f"{self.holder} failed before it held the model")
        prefixes = _HolderPrefix(self._ctx.pool.agent(self.holder), self._ctx.spec.model.path)
        return await resumable(prefixes, send)

    async def run(self, delivery: Delivery) -> None:
        """The holder serves files for this one transfer (its own token, from its staging
        directory too); the receiver fetches each once the holder holds it verified."""
        ctx, outcome, staging = self._ctx, delivery.outcome, delivery.staging
        name, holder = outcome.node, ctx.pool.agent(self.holder)
        sizes = {f.path: f.size for f in ctx.manifest.files}
        files = [FetchFile(path=f.path, offset=f.offset, size=sizes[f.path]) for f in delivery.send]
        ctx.progress.start(name, sum(f.size - f.offset for f in files))
        host = hop_address(ctx.spec, self.holder, name)
        token = secrets.token_hex(32)
        serve = ModelServe(
            path=ctx.spec.model.path, host=host, token=token, files=[f.path for f in files],
            staging=True,
        )
        serving = await holder.request(serve, ModelServing, SERVE_TIMEOUT_S)
        gate = asyncio.Semaphore(ctx.parallel_files)

        async def one(item: FetchFile) -> None:
            if not await self._holding.wait(item.path):
                raise RuntimeError(f"{self.holder} failed before it held {item.path}")
            async with gate:
                fetch = ModelFetch(
                    staging=staging, host=host, port=serving.port, token=token, files=[item]
                )
                got = await ctx.pool.agent(name).request(fetch, ModelFetched, HASH_TIMEOUT_S)
                outcome.sent_bytes += got.received_bytes
                ctx.progress.advance(name, got.received_bytes)
            sha256 = got.sha256[0] if got.sha256 else ""
            await verify_arrived(ctx, name, staging, item.path, f"{staging}/{item.path}", sha256)

        try:
            await each_file(files, one)
        finally:
            with contextlib.suppress(Exception):
                close = ModelServe(token=token, close=True)
                await holder.request(close, ModelServing, SERVE_TIMEOUT_S)
