"""The head's push, the pipeline's transfer from the sync's source (pipeline.py).

    source here: the node fetches each file from our TLS listener (head_fetch.py,
    head_serve.py; at our end of its cable when we are on the ring); if it cannot
    connect back, or the source is a node: we write through the node's transport files,
    SFTP (PARALLEL_FILES files at once, RESUME_WINDOW bytes in flight each), and the
    node hashes each file as soon as it arrived; each SHA-256 is checked against the
    manifest at once.
"""

from __future__ import annotations

import asyncio
import logging

from contract.model_manifest import FileToSend
from node_agent.models.store import human
from orchestrator.provision.sync.head_fetch import HeadUnreachable, fetch_from_head
from orchestrator.provision.sync.pipeline import Delivery, each_file, sync_node
from orchestrator.provision.sync.state import (
    FileFailed,
    NodeOutcome,
    SyncContext,
    resumable,
    verify_arrived,
)
from orchestrator.provision.sync.transfer import copy_file
from orchestrator.transports.files import NodeFiles
from orchestrator.transports.pool import NodeConnection

log = logging.getLogger("orchestrator.sync")


class HeadPush:
    """The node's bytes from the sync's source: fetched from this machine, else SFTP."""

    holder = ""

    def __init__(self, ctx: SyncContext) -> None:
        self._ctx = ctx

    async def resume(self, send: list[FileToSend]) -> list[FileToSend]:
        return await resumable(self._ctx.source, send)

    async def run(self, delivery: Delivery) -> None:
        """The node fetches from the head over TLS (a local source); if it cannot, SFTP."""
        ctx, outcome = self._ctx, delivery.outcome
        if ctx.head is not None:
            try:
                await fetch_from_head(ctx, delivery)
                return
            except HeadUnreachable as exc:
                log.warning("[%s] cannot fetch from this machine, pushing by SFTP: %s",
                            outcome.node, exc)
                outcome.head_error, outcome.sent_bytes = str(exc), 0
        outcome.via = "sftp"
        await _send_all(ctx, delivery)


async def push_node(ctx: SyncContext, node: NodeConnection) -> NodeOutcome:
    """The node synced from the sync's source."""
    return await sync_node(ctx, node, HeadPush(ctx))


async def open_files(node: NodeConnection) -> NodeFiles:
    if node.transport is None:  # its connection was closed meanwhile
        raise ConnectionError(f"{node.spec.name} is not connected")
    return await node.transport.open_files()


async def _send_all(ctx: SyncContext, delivery: Delivery) -> None:
    outcome, staging = delivery.outcome, delivery.staging
    sizes = {f.path: f.size for f in ctx.manifest.files}
    ctx.progress.start(outcome.node, sum(sizes[f.path] - f.offset for f in delivery.send))
    gate = asyncio.Semaphore(ctx.parallel_files)

    def sent(n: int) -> None:
        outcome.sent_bytes += n
        ctx.progress.advance(outcome.node, n)

    try:
        sink = await open_files(delivery.node)
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
        await verify_arrived(ctx, outcome.node, staging, item.path, dest)

    try:
        await each_file(delivery.send, one)
    finally:
        await sink.close()


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
