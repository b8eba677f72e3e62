"""`pull`: an hf: model's files into this machine's HF cache, once, resumable and verified.

    hub: revision ─▶ commit, and its files mlx-lm needs (sizes, LFS sha256 / git sha1)
    blobs already present: checked by hash (kept by size+mtime), a damaged one fetched again
    free disk at the store checked against what is missing ─▶ HubError before any byte
    each missing blob (8 at once): GET with Range into blobs/<etag>.partial
        ─▶ its hash checked against the hub's ─▶ renamed to blobs/<etag>
    huggingface_hub's snapshot_download links snapshots/<commit>/ and refs/<revision>

huggingface_hub 2.x downloads into a per-process temporary file that it deletes on any
failure, and checks only a file's size; the bytes go through our own `.partial` file
(kept across runs: an interrupted pull resumes where it stopped) and hash check, while
huggingface_hub still does the talking (URLs, auth headers, retries within a run, its
errors) and owns the cache layout, so mlx-lm and `hf` read what we wrote.
With HF_HUB_OFFLINE set nothing is fetched: the cache has the model, or the pull fails.
"""

from __future__ import annotations

import contextlib
import hashlib
import shutil
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, cast

from contract.model_ref import Hub, parse_hub
from contract.settings import ModelSettings
from node_agent.models.hashes import HashCache, HashStats, ModelFileError, cached_sha256
from node_agent.models.store import human
from orchestrator.models.hub import (
    HubAccess,
    HubError,
    RemoteFile,
    allow_patterns,
    explain,
    remote_listing,
)
from orchestrator.models.location import store_dir

PARALLEL_FILES = 8
CHUNK = 8 << 20
PARTIAL = ".partial"  # ours; huggingface_hub's own temporaries end in .incomplete


@dataclass
class PullReport:
    model: str  # the hf: spec
    commit: str = ""
    path: str = ""  # the snapshot directory at this machine
    files: int = 0
    total_bytes: int = 0
    cached_bytes: int = 0  # already in the cache before this pull
    resumed_bytes: int = 0  # kept from an interrupted pull, not fetched again
    downloaded_bytes: int = 0  # over the network now
    seconds: float = 0.0
    offline: bool = False

    @property
    def rate_mb_s(self) -> float:
        return self.downloaded_bytes / self.seconds / 1e6 if self.seconds else 0.0


class PullProgress:
    """What pull reports while it runs; this one shows nothing (--json)."""

    def start(self, total: int, done: int) -> None: ...
    def advance(self, n: int) -> None: ...
    def close(self) -> None: ...


class PullInterrupted(Exception):
    """Stopped by the operator; what arrived is kept in .partial files."""


def pull(
    model: ModelSettings, progress: PullProgress, access: HubAccess | None = None
) -> PullReport:
    """Bring the model's pinned commit into this machine's cache; raises HubError."""
    access = access or HubAccess.from_env()
    ref = parse_hub(model.path)
    root = store_dir(model)
    report = PullReport(model.path, offline=access.offline)
    started = time.monotonic()
    if access.offline:
        return _from_cache(ref, root, report, model.trust_remote_code)
    listing = remote_listing(ref, access, model.trust_remote_code)
    report.commit, report.files, report.total_bytes = (
        listing.commit,
        len(listing.files),
        listing.total_bytes,
    )
    blobs = root / ref.folder / "blobs"
    missing = _not_verified(listing.files, blobs)
    partial = {f.etag: _size(blobs / (f.etag + PARTIAL)) for f in missing}
    report.cached_bytes = report.total_bytes - sum(f.size for f in missing)
    report.resumed_bytes = sum(min(partial[f.etag], f.size) for f in missing)
    _check_space(root, sum(f.size for f in missing) - report.resumed_bytes, model)
    progress.start(report.total_bytes, report.cached_bytes + report.resumed_bytes)
    try:
        _fetch_all(ref, access, listing.commit, blobs, missing, progress, report)
    finally:
        progress.close()
    report.path = _link(ref, access, listing.commit, root, model.trust_remote_code)
    report.seconds = time.monotonic() - started
    return report


def _from_cache(ref: Hub, root: Path, report: PullReport, trust: bool) -> PullReport:
    # huggingface_hub where it is called (hub.py says why)
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import IncompleteSnapshotError, LocalEntryNotFoundError

    try:
        path = snapshot_download(
            ref.repo_id,
            revision=ref.revision,
            cache_dir=root,
            local_files_only=True,
            allow_patterns=allow_patterns(trust),
        )
    except (LocalEntryNotFoundError, IncompleteSnapshotError) as exc:
        raise HubError(
            f"HF_HUB_OFFLINE is set and this machine's cache {root} lacks {ref.spec} "
            f"({type(exc).__name__}): unset HF_HUB_OFFLINE for this pull (the ranks stay "
            "offline whatever you do here), or set HF_ENDPOINT to a reachable mirror"
        ) from None
    report.path = path
    report.commit = Path(path).name
    files = [p for p in Path(path).rglob("*") if p.is_file()]
    report.files, report.total_bytes = len(files), sum(p.stat().st_size for p in files)
    report.cached_bytes = report.total_bytes
    return report


def _not_verified(files: list[RemoteFile], blobs: Path) -> list[RemoteFile]:
    """The files to fetch: those whose blob is absent, or present (e.g. from `hf download`
    or mlx-lm, which check sizes only, or damaged on disk) but not hashing to its id; such
    a blob is removed. A blob's sha256 is kept in the hash cache by size and mtime, so a
    second pull of a verified 100 GB model does not read it again."""
    present = [f for f in files if _size(blobs / f.etag) == f.size]
    if not present:
        return list(files)
    cache = HashCache(blobs)
    try:
        with ThreadPoolExecutor(PARALLEL_FILES, thread_name_prefix="verify") as pool:
            sums = list(pool.map(lambda f: _blob_digest(blobs / f.etag, f, cache), present))
    finally:
        cache.save()
    bad = {f.etag for f, digest in zip(present, sums, strict=True) if digest != f.etag}
    for etag in bad:
        (blobs / etag).unlink(missing_ok=True)
    good = {f.etag for f in present} - bad
    return [f for f in files if f.etag not in good]


def _blob_digest(path: Path, f: RemoteFile, cache: HashCache) -> str:
    try:
        return cached_sha256(path, cache, HashStats()) if f.lfs else _digest(path, f)
    except (OSError, ModelFileError):
        return ""  # unreadable: fetched again


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _check_space(root: Path, needed: int, model: ModelSettings) -> None:
    where = root
    while not where.exists() and where != where.parent:
        where = where.parent
    free = shutil.disk_usage(where).free
    if needed > free:
        other = "another [model] store" if model.store else "[model] store to another disk"
        raise HubError(
            f"{model.path} needs {human(needed)} more at {root}, which has {human(free)} free: "
            f"nothing was downloaded; free space there, or set {other}"
        )


def _fetch_all(
    ref: Hub,
    access: HubAccess,
    commit: str,
    blobs: Path,
    files: list[RemoteFile],
    progress: PullProgress,
    report: PullReport,
) -> None:
    if not files:
        return
    blobs.mkdir(parents=True, exist_ok=True)
    stop = threading.Event()
    lock = threading.Lock()

    def arrived(n: int) -> None:
        if stop.is_set():
            raise PullInterrupted
        with lock:
            report.downloaded_bytes += n
        progress.advance(n)

    pool = ThreadPoolExecutor(PARALLEL_FILES, thread_name_prefix="pull")
    futures = [pool.submit(_fetch, ref, access, commit, blobs, f, arrived) for f in files]
    try:
        for future in futures:
            future.result()
    except BaseException:
        stop.set()  # the other files stop at their next chunk; their .partial files stay
        pool.shutdown(wait=True, cancel_futures=True)
        raise
    pool.shutdown()


def _fetch(
    ref: Hub,
    access: HubAccess,
    commit: str,
    blobs: Path,
    f: RemoteFile,
    arrived: Callable[[int], None],
) -> None:
    from huggingface_hub.file_download import hf_hub_url, http_get
    from huggingface_hub.utils import build_hf_headers

    partial = blobs / (f.etag + PARTIAL)
    if _size(partial) > f.size:
        partial.unlink()  # longer than the file: not a prefix of it
    url = hf_hub_url(ref.repo_id, f.path, revision=commit, endpoint=access.endpoint)
    headers = build_hf_headers(token=access.token or False)
    try:
        with partial.open("ab") as out:
            sink = _HashingSink(out, _hasher(f), arrived)
            sink.absorb(partial)  # a resumed file's kept prefix
            http_get(
                url,
                cast(BinaryIO, sink),  # what http_get calls of a file, all there
                resume_size=out.tell(),
                headers=headers,
                expected_size=f.size,
                displayed_filename=f.path,
            )
    except (HubError, PullInterrupted):
        raise
    except Exception as exc:
        error = explain(exc, ref, access)
        raise HubError(f"{f.path}: {error}; what arrived is kept: pull again to resume") from exc
    digest = sink.hexdigest() if sink.whole else _digest(partial, f)
    if digest != f.etag:
        partial.unlink()
        kind = "sha256" if f.lfs else "git blob sha1"
        raise HubError(
            f"{ref.spec} {f.path}: the bytes received have {kind} {digest[:16]}…, the hub "
            f"announced {f.etag[:16]}…: refused and removed; pull again (if it repeats, the "
            "endpoint or a proxy alters files)"
        )
    partial.replace(blobs / f.etag)
    if f.lfs:  # verified now: the next pull need not read it again
        _remember(blobs / f.etag, digest)


def _remember(blob: Path, sha256: str) -> None:
    cache = HashCache(blob.parent)
    with contextlib.suppress(OSError):
        cache.put(blob.stat(), sha256, blob)
        cache.save()


def _hasher(f: RemoteFile) -> Any:
    """How the hub names the blob: sha256 for LFS files, git's blob sha1 else."""
    return hashlib.sha256() if f.lfs else hashlib.sha1(f"blob {f.size}\0".encode())


def _digest(path: Path, f: RemoteFile) -> str:
    h = _hasher(f)
    with path.open("rb") as src:
        while chunk := src.read(CHUNK):
            h.update(chunk)
    return str(h.hexdigest())


class _HashingSink:
    """The file http_get writes to: hashes and counts what arrives as it arrives (no second
    read of a large file), and stops the download when asked (`arrived` raises)."""

    def __init__(self, out: BinaryIO, hasher: Any, arrived: Callable[[int], None]) -> None:
        self._out, self._hash, self._arrived = out, hasher, arrived
        self.whole = True  # False once http_get rewinds: then the file is hashed again

    def absorb(self, path: Path) -> None:
        with path.open("rb") as src:
            while chunk := src.read(CHUNK):
                self._hash.update(chunk)

    def write(self, data: bytes) -> int:
        n = self._out.write(data)
        self._hash.update(data)
        self._arrived(n)
        return n

    def tell(self) -> int:
        return self._out.tell()

    def seek(self, offset: int, whence: int = 0) -> int:
        self.whole = False  # a server that ignored Range: http_get starts the file over
        return self._out.seek(offset, whence)

    def truncate(self, size: int | None = None) -> int:
        self.whole = False
        return self._out.truncate(size)

    def hexdigest(self) -> str:
        return str(self._hash.hexdigest())


def _link(ref: Hub, access: HubAccess, commit: str, root: Path, trust: bool) -> str:
    """huggingface_hub writes snapshots/<commit>/ from the blobs now present (no bytes move)
    and we pin the revision the operator named in refs/<revision>."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.utils import disable_progress_bars

    disable_progress_bars()
    try:
        path = snapshot_download(
            ref.repo_id,
            revision=commit,
            cache_dir=root,
            allow_patterns=allow_patterns(trust),
            endpoint=access.endpoint,
            token=access.token or False,
        )
    except Exception as exc:
        raise explain(exc, ref, access) from exc
    if not ref.pinned:
        refs = root / ref.folder / "refs" / ref.revision
        refs.parent.mkdir(parents=True, exist_ok=True)
        refs.write_text(commit)
    return path
