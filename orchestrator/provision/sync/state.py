"""What one sync run shares between its steps: the context, each node's outcome, and the
helpers both the head's push (push.py) and forwarding (forward.py) use."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal, Protocol

from contract.model_manifest import (
    FileRange,
    FileToSend,
    Manifest,
    ModelPrefixHash,
    PrefixHashes,
)
from orchestrator.config import ClusterSpec
from orchestrator.provision.sync.head_serve import HeadServer
from orchestrator.provision.sync.progress import SyncProgress
from orchestrator.provision.sync.subsets import Subsets
from orchestrator.provision.sync.transfer import HASH_TIMEOUT_S, PARALLEL_FILES, Source
from orchestrator.transports.errors import AgentRequestError, TransportError
from orchestrator.transports.pool import NodePool

Status = Literal["current", "synced", "failed", "source"]


class PrefixSource(Protocol):
    """Whoever holds the source's bytes and hashes their prefixes (a Source, a holder)."""

    async def prefix_sha256(self, ranges: list[FileRange]) -> list[str]: ...


@dataclass
class NodeOutcome:
    node: str
    status: Status
    sent_bytes: int = 0  # over the network now
    reused_bytes: int = 0  # right already in the node's previous copy (linked, not sent)
    resumed_bytes: int = 0  # staged by an interrupted run and verified
    hashed_bytes: int = 0  # read and hashed on the node now (0 when its cache knew all)
    transfer_seconds: float = 0.0
    seconds: float = 0.0  # prepare to finalize
    error: str = ""
    need_bytes: int = 0  # the files this node's rank loads (pipeline: its layers' shards)
    layers: tuple[int, int] | None = None  # pipeline: the rank's layers [start, end)
    forwarded_from: str = ""  # sync_forwarding: the node it fetched from (not the head)
    forward_error: str = ""  # forwarding failed (the head pushed instead): why
    head_error: str = ""  # fetching from the head failed (then SFTP): why
    via: str = ""  # how the bytes came: "tls <head address>", "sftp", or "" (none sent)


@dataclass
class SyncContext:
    spec: ClusterSpec
    pool: NodePool
    manifest: Manifest
    source: Source
    progress: SyncProgress
    rerun: str  # the command that resumes
    subsets: Subsets = field(default_factory=Subsets)
    source_name: str = ""  # "this machine" or the node's name
    head: HeadServer | None = None  # this machine's files over TLS (a local source)
    # (node, file): that node holds the file verified (forwarding waits on it)
    verified: Callable[[str, str], None] = lambda node, path: None
    # Files sent to one node at once; forwarding sends one after the other, so the next
    # node can fetch the first while the second arrives.
    parallel_files: int = PARALLEL_FILES


async def resumable(source: PrefixSource, send: list[FileToSend]) -> list[FileToSend]:
    """Partial files whose staged prefix equals the source's resume there, others from 0."""
    partial = [f for f in send if f.offset]
    if not partial:
        return send
    hashes = await source.prefix_sha256([FileRange(path=f.path, length=f.offset) for f in partial])
    agree = {f.path for f, sha in zip(partial, hashes, strict=True) if sha == f.prefix_sha256}
    return [f if f.path in agree else FileToSend(path=f.path, offset=0) for f in send]


FIXES = {
    "no_space": "free space on that disk (or choose another model.path), then sync again",
    "model_io": "check the path and its permissions for the SSH user, then sync again",
    "model_mismatch": "",
}


def agent_error(exc: AgentRequestError | TransportError, rerun: str) -> str:
    if isinstance(exc, TransportError):
        return f"{exc.message}; run `{rerun}` again once the node is back (it resumes)"
    fix = FIXES.get(exc.code, f"run `{rerun}` again")
    return f"{exc.message}" + (f"; {fix}" if fix else f"; run `{rerun}` again")


class FileFailed(Exception):
    """Sending one file failed; the message names the node's file and the fix."""


async def verify_arrived(
    ctx: SyncContext, node: str, staging: str, rel: str, dest: str, got: str = ""
) -> None:
    """The file's SHA-256 against the manifest's, a difference reported at once. got: the
    node hashed it as it arrived (a fetch); else the node hashes it now, while others
    still arrive (SFTP). Either way finalize then finds the hash in the node's cache."""
    expected = next(f for f in ctx.manifest.files if f.path == rel)
    if not got:
        ask = ModelPrefixHash(path=staging, ranges=[FileRange(path=rel, length=expected.size)])
        got = (await ctx.pool.agent(node).request(ask, PrefixHashes, HASH_TIMEOUT_S)).sha256[0]
    if got != expected.sha256:
        raise FileFailed(
            f"{dest} arrived with SHA-256 {got[:16]}…, which differs from the source's "
            f"{expected.sha256[:16]}…; "
            f"run `{ctx.rerun}` again (if it repeats, check that node's disk and memory)"
        )
    ctx.verified(node, rel)


def mark_held(ctx: SyncContext, node: str, manifest: Manifest, send: list[FileToSend]) -> None:
    """After prepare: the files the node is not sent it holds verified already."""
    sending = {f.path for f in send}
    for f in manifest.files:
        if f.path not in sending:
            ctx.verified(node, f.path)
