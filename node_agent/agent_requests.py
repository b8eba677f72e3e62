"""Parts of the agent's answers: the blocking model-file requests (run in a worker
thread) and the error reply of a request that failed."""

from __future__ import annotations

import logging
from pathlib import Path

from contract import agent_protocol as protocol
from contract.agent_protocol import ErrorReply, Request
from contract.message import Message
from contract.model_manifest import (
    MODEL_IO,
    ManifestResult,
    ModelFinalize,
    ModelManifest,
    ModelPrefixHash,
    ModelPrepare,
)
from node_agent.code_digest import code_digest
from node_agent.models import store
from node_agent.models.hashes import ModelFileError, build_manifest
from node_agent.ranks import SpawnError

log = logging.getLogger("node_agent")


ModelFileRequest = ModelManifest | ModelPrepare | ModelPrefixHash | ModelFinalize


def model_request(req: ModelFileRequest) -> Message:
    """The sync requests: blocking file work (hashing), run in a thread."""
    match req:
        case ModelManifest():
            root = store.model_path(req.path)
            if not root.is_dir():
                raise store.StoreError(MODEL_IO, f"{root} is not a directory on this node")
            manifest, stats = build_manifest(root, contained=True)  # the sync source
            return ManifestResult(
                id=req.id, path=str(root), manifest=manifest, hashed_bytes=stats.hashed_bytes
            )
        case ModelPrepare():
            return store.prepare(req)
        case ModelPrefixHash():
            return store.prefix_hashes(req)
        case ModelFinalize():
            return store.finalize(req)


def safe_digest(root: Path) -> str | None:
    try:
        return code_digest(root)
    except OSError:
        return None


def error_reply(req: Request, exc: Exception) -> ErrorReply:
    """A failed request's answer: the error code the orchestrator acts on, and why."""
    match exc:
        case SpawnError():
            return ErrorReply(id=req.id, code=protocol.SPAWN_FAILED, message=str(exc))
        case store.StoreError():
            return ErrorReply(id=req.id, code=exc.code, message=exc.message)
        case ModelFileError():
            return ErrorReply(id=req.id, code=MODEL_IO, message=str(exc))
        case KeyError():
            return ErrorReply(
                id=req.id, code=protocol.UNKNOWN_RANK, message=f"no running rank {exc}"
            )
        case OSError():  # Listen on an address this node cannot bind
            return ErrorReply(
                id=req.id, code=protocol.BIND_FAILED, message=f"{exc.strerror or exc}"
            )
    # Not the request itself: a spawn's files hold rank 0's launch secret.
    log.exception("request %s (id %s) failed", type(req).__name__, req.id, exc_info=exc)
    message = f"{type(exc).__name__}: {exc}"
    return ErrorReply(id=req.id, code=protocol.INTERNAL, message=message)
