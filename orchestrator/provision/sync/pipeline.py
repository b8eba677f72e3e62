"""One node's sync, whichever way its bytes come: prepare, transfer, finalize.

    ModelPrepare ─▶ current? ── yes ─▶ done
                    │ no: the right files linked into <path>.partial-sync
                    ▼
    Transfer.resume: which staged prefixes agree with the bytes' holder (resume there)
                    ▼
    Transfer.run: the missing bytes into staging, each file verified as it arrives
                    ▼
    ModelFinalize: the node checks every staged file, renames the directory into place

Only the transfer differs: the head's push (push.py: the node fetches from our TLS
listener, else SFTP) or a forwarding hop (forward.py: the node fetches from its
predecessor on the ring). A hop's failure is not the node's last word (the head pushes
it next), so only the push reports FAILED and tells the operator to run again.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Protocol, TypeVar

from contract.model_manifest import (
    FileToSend,
    Manifest,
    ModelFinalize,
    ModelFinalized,
    ModelPrepare,
    ModelPrepared,
)
from orchestrator.provision.sync.state import (
    FileFailed,
    NodeOutcome,
    SyncContext,
    agent_error,
    mark_held,
)
from orchestrator.provision.sync.transfer import HASH_TIMEOUT_S, RESUME_WINDOW
from orchestrator.transports.errors import AgentRequestError, TransportError
from orchestrator.transports.pool import NodeConnection

log = logging.getLogger("orchestrator.sync")
Item = TypeVar("Item")


@dataclass
class Delivery:
    """What one transfer delivers: the files to send into a node's staging directory."""

    node: NodeConnection
    staging: str  # the node's <path>.partial-sync
    send: list[FileToSend]  # each from its offset (a resumed prefix)
    outcome: NodeOutcome  # the transfer adds its bytes, how they came, why it fell back


class Transfer(Protocol):
    """The pipeline's pluggable step: where a node's missing bytes come from."""

    # The node the bytes come from when it is not the sync's source (forwarding); its
    # failure then leaves the node to the head's push.
    holder: str

    async def resume(self, send: list[FileToSend]) -> list[FileToSend]:
        """send with each partial file kept where its prefix agrees with the holder's."""
        ...

    async def run(self, delivery: Delivery) -> None:
        """Every file of the delivery into staging, verified; raises on any failure."""
        ...


async def sync_node(ctx: SyncContext, node: NodeConnection, transfer: Transfer) -> NodeOutcome:
    """The node's copy made the source's by way of `transfer`; its outcome, never a raise."""
    name = node.spec.name
    manifest = ctx.subsets.manifest(name, ctx.manifest)
    outcome = NodeOutcome(name, "failed", need_bytes=manifest.total_bytes)
    outcome.layers = ctx.subsets.layers.get(name)
    started = time.monotonic()
    try:
        await _steps(ctx, node, manifest, transfer, outcome)
    except (AgentRequestError, TransportError) as exc:
        outcome.error = agent_error(exc, ctx.rerun)
    except FileFailed as exc:
        outcome.error = str(exc)
    except Exception as exc:  # a timeout, or a bug: still this node's outcome, not a crash
        log.debug("[%s] %s failed", name, "forwarding" if transfer.holder else "sync",
                  exc_info=True)
        outcome.error = f"{type(exc).__name__}: {exc}"
        if not transfer.holder:
            outcome.error += f"; run `{ctx.rerun}` again (it resumes)"
    if outcome.status == "failed" and not transfer.holder:
        ctx.progress.done(name, "FAILED")
    outcome.seconds = time.monotonic() - started
    return outcome


async def _steps(
    ctx: SyncContext,
    node: NodeConnection,
    manifest: Manifest,
    transfer: Transfer,
    outcome: NodeOutcome,
) -> None:
    name = node.spec.name
    if name in ctx.subsets.missing:
        raise FileFailed(_source_lacks(ctx, name))
    agent = ctx.pool.agent(name)
    prepare = ModelPrepare(path=ctx.spec.model.path, manifest=manifest, resume_window=RESUME_WINDOW)
    prepared = await agent.request(prepare, ModelPrepared, HASH_TIMEOUT_S)
    outcome.hashed_bytes = prepared.hashed_bytes
    mark_held(ctx, name, manifest, [] if prepared.current else prepared.send)
    if prepared.current:
        outcome.status = "current"
        ctx.progress.done(name, "already current")
        return
    outcome.reused_bytes = prepared.reused_bytes
    send = await transfer.resume(prepared.send)
    outcome.resumed_bytes = prepared.staged_bytes + sum(f.offset for f in send)
    transfer_started = time.monotonic()
    await transfer.run(Delivery(node, prepared.staging, send, outcome))
    outcome.transfer_seconds = time.monotonic() - transfer_started
    finalize = ModelFinalize(path=ctx.spec.model.path, manifest=manifest)
    finalized = await agent.request(finalize, ModelFinalized, HASH_TIMEOUT_S)
    outcome.hashed_bytes += finalized.hashed_bytes
    outcome.status, outcome.forwarded_from = "synced", transfer.holder
    ctx.progress.done(name, f"verified (from {transfer.holder})" if transfer.holder else "verified")


def _source_lacks(ctx: SyncContext, name: str) -> str:
    lacking = ctx.subsets.missing[name]
    return (
        f"the source {ctx.source_name} lacks {len(lacking)} files this node's layers need "
        f"({', '.join(lacking[:3])}): it holds only its own stage's shards; sync from a "
        "machine with the whole model (this machine, or --from NODE)"
    )


async def each_file(items: Iterable[Item], one: Callable[[Item], Awaitable[None]]) -> None:
    """one(item) for every item at once; each runs to its end (success or its own error:
    see transfer.copy_file), then the first failure is raised."""
    results = await asyncio.gather(*(one(item) for item in items), return_exceptions=True)
    failures = [r for r in results if isinstance(r, BaseException)]
    if failures:
        raise failures[0]
