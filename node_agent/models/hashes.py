"""SHA-256 of model files, each computed once: a cache keyed by the file's identity.

    <cache>/<sha256(device:realpath of the model dir)[:16]>.json
        {"<st_dev>:<st_ino>": [size, mtime_ns, ctime_ns, sha256, path], ...}

A file's hash is reused while its inode, size, mtime and ctime are unchanged. Any write
through the file system moves ctime (which no tool can set back), so a byte changed in
place is never hidden by the cache; a rename keeps all four, so a copy renamed into
place needs no rehash. Several files are hashed at once (hashlib drops the GIL).
Several caches of one file may be open at once (an agent's requests run in threads): a
save merges the entries put since the last one into the file as it is now, so none drops
another's. The cache is an optimisation only: unreadable or unwritable, it is ignored.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from contract.model_manifest import Manifest, ManifestFile

log = logging.getLogger("node_agent.model")

DEFAULT_CACHE_DIR = Path("~/.cache/mlx-cluster-orchestrator/file-hashes")
CACHE_ENV = "ORCHESTRATOR_HASH_CACHE"  # another cache directory (tests, read-only homes)
CHUNK = 8 << 20
SAVE_EVERY_S = 10.0  # a long first hash keeps what it has done if it is interrupted
HASH_THREADS = 4
_SAVING = threading.Lock()  # a save's read, merge and write, one at a time in a process


class HashCache:
    def __init__(self, root: Path, cache_dir: Path | None = None) -> None:
        base = cache_dir or Path(os.environ.get(CACHE_ENV) or DEFAULT_CACHE_DIR).expanduser()
        # By the parent, so the staging directory next to a model shares its cache file
        # and a copy renamed into place is found there.
        try:
            parent = root.parent.resolve()
            ident = f"{parent.stat().st_dev}:{parent / root.name}"
        except OSError:
            ident = str(root)
        self.file = base / f"{hashlib.sha256(ident.encode()).hexdigest()[:16]}.json"
        self._lock = threading.Lock()
        self._put: set[str] = set()  # keys put since the last save
        self._saved_at = time.monotonic()
        self._entries = self._load()

    def _load(self) -> dict[str, list[object]]:
        try:
            loaded = json.loads(self.file.read_text())
        except (OSError, ValueError):
            return {}
        return loaded if isinstance(loaded, dict) else {}

    @staticmethod
    def _key(st: os.stat_result) -> str:
        return f"{st.st_dev}:{st.st_ino}"

    def get(self, st: os.stat_result) -> str | None:
        with self._lock:
            entry = self._entries.get(self._key(st))
        if entry and entry[:3] == [st.st_size, st.st_mtime_ns, st.st_ctime_ns]:
            return str(entry[3])
        return None

    def put(self, st: os.stat_result, sha256: str, path: Path) -> None:
        with self._lock:
            self._entries[self._key(st)] = [
                st.st_size,
                st.st_mtime_ns,
                st.st_ctime_ns,
                sha256,
                str(path),
            ]
            self._put.add(self._key(st))
            due = time.monotonic() - self._saved_at > SAVE_EVERY_S
        if due:
            self.save()

    def save(self) -> None:
        """Our new entries merged into the file as it is now (another cache of the same
        file may have saved since we loaded it)."""
        with _SAVING:
            with self._lock:
                if not self._put:
                    return
                ours = {k: self._entries[k] for k in self._put}
                self._put.clear()
                self._saved_at = time.monotonic()
            merged = {k: v for k, v in (self._load() | ours).items() if _live(k, v)}
            with self._lock:
                self._entries = merged | {k: self._entries[k] for k in self._put}
            tmp = self.file.with_name(f".{self.file.name}.{os.getpid()}")
            try:
                self.file.parent.mkdir(parents=True, exist_ok=True)
                tmp.write_text(json.dumps(merged))
                tmp.replace(self.file)
            except OSError as exc:
                log.warning("cannot write the hash cache %s: %s", self.file, exc)
                tmp.unlink(missing_ok=True)


def _live(key: str, entry: list[object]) -> bool:
    """The entry's file still exists as that inode (entries of removed files are dropped)."""
    try:
        st = os.stat(str(entry[4]))
    except (OSError, IndexError):
        return False
    return key == f"{st.st_dev}:{st.st_ino}"


class ModelFileError(Exception):
    """A model file cannot be read; the message names it."""


def sha256_file(path: Path, length: int | None = None) -> str:
    """sha256 of the file, or of its first `length` bytes."""
    return sha256_prefix(path, length).hexdigest()


def sha256_prefix(path: Path, length: int | None = None) -> hashlib._Hash:
    """A sha256 fed the file (or its first `length` bytes), to be fed more."""
    h = hashlib.sha256()
    left = length
    buf = bytearray(CHUNK)
    view = memoryview(buf)
    with path.open("rb", buffering=0) as f:
        while left is None or left > 0:
            n = f.readinto(view if left is None or left >= CHUNK else view[:left])
            if not n:
                break
            h.update(view[:n])
            if left is not None:
                left -= n
    if left:
        raise ModelFileError(f"{path} is shorter than {length} bytes")
    return h


@dataclass
class HashStats:
    hashed_bytes: int = 0  # read and hashed now
    cached_bytes: int = 0  # taken from the cache


def cached_sha256(path: Path, cache: HashCache, stats: HashStats) -> str:
    try:
        st = path.stat()
        known = cache.get(st)
        if known is not None:
            stats.cached_bytes += st.st_size
            return known
        digest = sha256_file(path)
        after = path.stat()
    except OSError as exc:
        raise ModelFileError(f"cannot read {path}: {exc.strerror or exc}") from exc
    if (after.st_size, after.st_mtime_ns) == (st.st_size, st.st_mtime_ns):
        cache.put(after, digest, path)  # else it changed while we read it: do not keep
    stats.hashed_bytes += st.st_size
    return digest


def list_files(root: Path) -> list[str]:
    """Every regular file under root (symlinks followed), as sorted POSIX paths; hidden
    ones left out (no loader reads them, and they differ between machines: macOS's
    .DS_Store, `huggingface-cli download`'s .cache/ with download times)."""
    try:
        entries = list(root.rglob("*"))
        dangling = [p for p in entries if p.is_symlink() and not p.exists()]
        found = [p for p in entries if p.is_file()]
    except OSError as exc:
        raise ModelFileError(f"cannot list {root}: {exc.strerror or exc}") from exc
    dangling = [
        p for p in dangling if not any(x.startswith(".") for x in p.relative_to(root).parts)
    ]
    if dangling:
        raise ModelFileError(
            f"{dangling[0]} is a symlink to {os.readlink(dangling[0])}, which does not exist"
        )
    rels = (p.relative_to(root) for p in found)
    return sorted(r.as_posix() for r in rels if not any(part.startswith(".") for part in r.parts))


def refuse_links_out(root: Path, rels: list[str]) -> None:
    """Sync ships what a model's files resolve to, to every node: a link to ~/.ssh/id_ed25519
    or /etc/passwd would be copied everywhere. Links inside the model are fine, and so are an
    HF cache snapshot's links into its repository's blobs/ (snapshots/<commit>/f ->
    ../../blobs/<id>)."""
    base = root.resolve()
    inside = [base]
    if root.parent.name == "snapshots":
        inside.append(root.parent.parent.resolve() / "blobs")
    for rel in rels:
        path = root / rel
        target = path.resolve()
        if not any(target.is_relative_to(where) for where in inside):
            raise ModelFileError(
                f"{path} leads to {target}, outside the model directory {root}: sync would "
                "copy it to every node, so it is refused; copy the file into the model "
                "directory, or remove the link"
            )


def hash_files(
    root: Path, rels: list[str], cache: HashCache, stats: HashStats
) -> dict[str, tuple[int, str]]:
    """{rel: (size, sha256)}, several files at once; raises ModelFileError."""

    def one(rel: str) -> tuple[int, str]:
        digest = cached_sha256(root / rel, cache, stats)
        return (root / rel).stat().st_size, digest

    try:
        with ThreadPoolExecutor(min(HASH_THREADS, os.cpu_count() or 1)) as pool:
            results = list(pool.map(one, rels))
    except OSError as exc:
        raise ModelFileError(f"cannot read a file under {root}: {exc}") from exc
    finally:
        cache.save()
    return dict(zip(rels, results, strict=True))


def build_manifest(
    root: Path, cache: HashCache | None = None, contained: bool = False
) -> tuple[Manifest, HashStats]:
    """The manifest of the directory at root; raises ModelFileError naming the file.
    `contained` (a sync source): a symlink leading out of the model is refused."""
    cache = cache or HashCache(root)
    stats = HashStats()
    rels = list_files(root)
    if contained:
        refuse_links_out(root, rels)
    hashed = hash_files(root, rels, cache, stats)
    files = [ManifestFile(path=rel, size=size, sha256=sha) for rel, (size, sha) in hashed.items()]
    return Manifest(files=files), stats
