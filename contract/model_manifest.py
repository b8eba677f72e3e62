"""A model directory's manifest: every file with its size and SHA-256.

    source ──build (hashes cached by file identity)──▶ Manifest ──▶ orchestrator
    node agent ◀── ModelPrepare / ModelFinalize(manifest) ── checks its copy against it

Two directories with equal manifest digests hold the same bytes. The manifest is what
`orchestrator sync` copies by and what preflight compares between nodes.
"""

from __future__ import annotations

import hashlib

import msgspec
from msgspec import Struct

from contract.message import Message


class ManifestFile(Struct, frozen=True, kw_only=True):
    path: str  # POSIX path relative to the model directory
    size: int
    sha256: str  # of the whole file, as `shasum -a 256` prints it


class Manifest(Struct, frozen=True, kw_only=True):
    files: list[ManifestFile]  # sorted by path

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)

    def digest(self) -> str:
        """sha256 over every (path, size, sha256): equal digests, equal directories."""
        h = hashlib.sha256()
        for f in sorted(self.files, key=lambda f: f.path):
            h.update(f"{f.path}\0{f.size}\0{f.sha256}\n".encode())
        return h.hexdigest()

    def by_path(self) -> dict[str, ManifestFile]:
        return {f.path: f for f in self.files}


def safe_relative(path: str) -> bool:
    """A manifest path stays inside its directory: relative, no `..`, no empty parts."""
    parts = path.split("/")
    return bool(path) and not path.startswith("/") and all(p not in ("", ".", "..") for p in parts)


# ── agent protocol messages of `orchestrator sync` (members of agent_protocol's unions) ──
#
#   orchestrator ── ModelManifest(path) ───────────▶ source node agent ─▶ ManifestResult
#   orchestrator ── ModelPrepare(path, manifest) ──▶ target node agent ─▶ ModelPrepared
#        (target: checks its copy, stages into <path>.partial-sync, checks free space)
#   orchestrator ══ SFTP writes into the staging directory ══▶ target node
#   orchestrator ── ModelFinalize(path, manifest) ─▶ target: verifies every file, renames


class ModelManifest(Message, tag="model_manifest", kw_only=True):
    """Hash the model directory at path (cached by file identity) and send its manifest."""

    id: int = 0
    path: str


class ManifestResult(Message, tag="manifest", kw_only=True):
    id: int
    path: str  # expanded on the node
    manifest: Manifest
    hashed_bytes: int = 0  # bytes actually read (0 when every hash came from the cache)


class ModelPrepare(Message, tag="model_prepare", kw_only=True):
    """Compare the copy at path with manifest; unless equal, stage the files that are
    right already and report what must still be sent. Refuses (`no_space`) before
    changing anything when the file system lacks room for the rest."""

    id: int = 0
    path: str
    manifest: Manifest
    # Bytes of a partial file that may hold holes (writes that were in flight when the
    # copy stopped): the agent keeps the verified part before them.
    resume_window: int = 0


class FileToSend(Struct, frozen=True, kw_only=True):
    path: str
    offset: int  # bytes staged already; valid only if prefix_sha256 matches the source's
    prefix_sha256: str = ""  # sha256 of the staged bytes [0, offset)


class ModelPrepared(Message, tag="model_prepared", kw_only=True):
    id: int
    path: str  # expanded on the node
    current: bool  # the copy at path matches the manifest: nothing to do
    staging: str = ""  # the directory to write into (next to path, same file system)
    send: list[FileToSend] = msgspec.field(default_factory=list)
    reused_bytes: int = 0  # taken from the copy at path (linked, not sent)
    staged_bytes: int = 0  # already in the staging directory from an earlier run
    free_bytes: int = 0
    hashed_bytes: int = 0


class FileRange(Struct, frozen=True, kw_only=True):
    path: str
    length: int


class ModelPrefixHash(Message, tag="model_prefix_hash", kw_only=True):
    """sha256 of the first `length` bytes of files of the model at path (a source node
    answers this so a target's partial file can be checked before resuming it)."""

    id: int = 0
    path: str
    ranges: list[FileRange]


class PrefixHashes(Message, tag="prefix_hashes", kw_only=True):
    id: int
    sha256: list[str]  # in the order of ranges


class ModelFinalize(Message, tag="model_finalize", kw_only=True):
    """Verify every staged file against the manifest; if all match, rename the staging
    directory into place (the previous copy is removed)."""

    id: int = 0
    path: str
    manifest: Manifest


class ModelFinalized(Message, tag="model_finalized", kw_only=True):
    id: int
    path: str
    files: int
    hashed_bytes: int = 0


# Error codes of ErrorReply for these requests.
NO_SPACE = "no_space"  # the node's file system lacks room: nothing was changed
MODEL_IO = "model_io"  # a file or directory cannot be read, written or renamed
MODEL_MISMATCH = "model_mismatch"  # staged files differ from the manifest (removed)
NOT_OURS = "not_ours"  # something sync did not make sits at the model's path: left intact
SENDER_UNREACHABLE = "sender_unreachable"  # ModelFetch could not connect (or no TLS)


# ── forwarding along the ring: a node that holds verified files serves them to the next ──
#
#   orchestrator ── ModelServe(path, host, token) ─▶ holding agent ─▶ ModelServing(port)
#   orchestrator ── ModelPrepare ─▶ receiving agent (as above: what must still come)
#   orchestrator ── ModelFetch(staging, host, port, token, files) ─▶ receiving agent
#        receiving agent ══ TCP, token first ══▶ holding agent's listener: the bytes
#   orchestrator ── ModelFinalize ─▶ receiving agent: the manifest check of this hop
#   orchestrator ── ModelServe(close=True, token) ─▶ holding agent: listener closed


class ModelServe(Message, tag="model_serve", kw_only=True):
    """Listen on host (port chosen by the agent) and serve the files of the model at path
    to a client that presents token; close=True closes the listener with that token."""

    id: int = 0
    path: str = ""
    host: str = ""
    token: str
    files: list[str] = msgspec.field(default_factory=list)  # the only paths served
    close: bool = False
    # Also serve from <path>.partial-sync (first): a node forwards files it verified while
    # it still receives others, and before its own copy is renamed into place.
    staging: bool = False


class ModelServing(Message, tag="model_serving", kw_only=True):
    id: int
    port: int


class FetchFile(Struct, frozen=True, kw_only=True):
    path: str
    offset: int  # staged already (the orchestrator checked its prefix against the holder's)
    size: int


class ModelFetch(Message, tag="model_fetch", kw_only=True):
    """Fetch files [offset, size) from another agent's ModelServe listener into the
    staging directory of a ModelPrepare; the orchestrator then sends ModelFinalize."""

    id: int = 0
    staging: str
    host: str
    port: int
    token: str
    files: list[FetchFile]
    timeout_s: float = 30.0  # to connect, and between two reads
    # The server's certificate (PEM) when it speaks TLS (the head's own listener): the
    # only one trusted for this fetch; "" for plain TCP (a neighbour on its cable).
    tls_cert: str = ""


class ModelFetched(Message, tag="model_fetched", kw_only=True):
    id: int
    received_bytes: int
    # Each file's SHA-256 (in the request's order), hashed as its bytes were written, its
    # staged prefix first: the orchestrator checks it against the manifest at once, and
    # the node's hash cache holds it for ModelFinalize (no file is read a second time).
    sha256: list[str] = msgspec.field(default_factory=list)


RelayRequest = ModelServe | ModelFetch  # members of agent_protocol's Request union
RelayReply = ModelServing | ModelFetched
