"""A node fetches the files it lacks from the head's TLS listener (head_serve.py): one
ModelFetch per file, PARALLEL_FILES at once, each hashed by the node as its bytes arrive
and checked against the manifest when its fetch answers (then ModelFinalize finds every
hash in the node's cache)."""

from __future__ import annotations

import asyncio

from contract.model_manifest import (
    SENDER_UNREACHABLE,
    FetchFile,
    FileToSend,
    ModelFetch,
    ModelFetched,
)
from orchestrator.provision.sync.head_serve import head_address
from orchestrator.provision.sync.pipeline import Delivery, each_file
from orchestrator.provision.sync.state import SyncContext, verify_arrived
from orchestrator.provision.sync.transfer import HASH_TIMEOUT_S
from orchestrator.transports.errors import AgentRequestError

CONNECT_TIMEOUT_S = 10.0  # then the head pushes by SFTP instead


class HeadUnreachable(Exception):
    """The node cannot fetch from this machine (no route, a firewall): push by SFTP."""


async def fetch_from_head(ctx: SyncContext, delivery: Delivery) -> None:
    """Every file of the delivery into staging, verified; raises HeadUnreachable (the
    caller pushes by SFTP), AgentRequestError, FileFailed (a file arrived wrong)."""
    head = ctx.head
    assert head is not None
    node, staging, send, outcome = delivery.node, delivery.staging, delivery.send, delivery.outcome
    name = node.spec.name
    try:  # a name may need resolving (mDNS): not on the event loop
        host = await asyncio.to_thread(head_address, ctx.spec, node.spec)
        port = await head.port(host)
    except OSError as exc:
        raise HeadUnreachable(f"cannot listen where {name} would reach us: {exc}") from None
    outcome.via = f"tls {host}"
    sizes = {f.path: f.size for f in ctx.manifest.files}
    ctx.progress.start(name, sum(sizes[f.path] - f.offset for f in send))
    gate = asyncio.Semaphore(ctx.parallel_files)
    failed = asyncio.Event()

    async def one(item: FileToSend) -> None:
        async with gate:
            if failed.is_set():
                return
            fetch = ModelFetch(
                staging=staging, host=host, port=port, token=head.token,
                files=[FetchFile(path=item.path, offset=item.offset, size=sizes[item.path])],
                timeout_s=CONNECT_TIMEOUT_S, tls_cert=head.cert_pem,
            )
            try:
                got = await ctx.pool.agent(name).request(fetch, ModelFetched, HASH_TIMEOUT_S)
            except AgentRequestError as exc:
                failed.set()
                if exc.code == SENDER_UNREACHABLE:
                    raise HeadUnreachable(exc.message) from None
                raise
            except BaseException:
                failed.set()
                raise
            outcome.sent_bytes += got.received_bytes
            ctx.progress.advance(name, got.received_bytes)
        sha256 = got.sha256[0] if got.sha256 else ""
        await verify_arrived(ctx, name, staging, item.path, f"{staging}/{item.path}", sha256)

    await each_file(send, one)
