"""The node's side of `orchestrator sync`: check the copy, stage, verify, rename into place.

    <path>                   the model as ranks load it: only ever a complete, verified copy
    <path>.partial-sync/     staging (same parent, so one rename puts it in place); files the
                             copy at <path> has right already are hard-linked here, the rest
                             arrive by SFTP; it survives an interrupted sync, which resumes
    <path>.old-sync/         the previous copy for the instant between two renames
    <path>/.mlx-cluster-sync  in every copy sync put in place: only such a copy (or an empty
                             directory) is ever replaced; anything else at <path> is refused
                             and left intact (hidden, so no manifest lists it)

Blocking (hashing, file system); the agent runs these in threads. Every failure is a
StoreError whose message names the node's path and the file.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import threading
from dataclasses import dataclass, field
from pathlib import Path

from contract.model_manifest import (
    MODEL_IO,
    MODEL_MISMATCH,
    NO_SPACE,
    NOT_OURS,
    FileToSend,
    Manifest,
    ModelFinalize,
    ModelFinalized,
    ModelPrefixHash,
    ModelPrepare,
    ModelPrepared,
    PrefixHashes,
    safe_relative,
)
from node_agent.models.hashes import (
    HashCache,
    HashStats,
    ModelFileError,
    cached_sha256,
    list_files,
    sha256_file,
)
from node_agent.probes.system import disk

STAGING_SUFFIX = ".partial-sync"
OLD_SUFFIX = ".old-sync"
SYNC_MARKER = ".mlx-cluster-sync"
SYNC_BUSY = "sync_busy"  # another agent (another orchestrator's sync) is writing this model

# One sync at a time per model path on a node: the agent holds an flock from prepare to
# finalize (or until it exits: the kernel drops it then), next to the path's hash cache.
_held: dict[str, int] = {}
_held_lock = threading.Lock()


class StoreError(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def model_path(spec: str) -> Path:
    path = Path(spec).expanduser()
    if not path.is_absolute():
        raise StoreError(MODEL_IO, f"{spec} is not an absolute path (nor ~/...)")
    return path


def staging_path(target: Path) -> Path:
    return target.with_name(target.name + STAGING_SUFFIX)


def human(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    raise AssertionError


def _lock(target: Path, cache: HashCache) -> None:
    name = str(cache.file.with_suffix(".lock"))
    with _held_lock:
        if name in _held:
            return
        try:
            cache.file.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(name, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError:
            return  # no cache directory: no lock either (the hash check still protects)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise StoreError(
                SYNC_BUSY,
                f"another sync is writing {target} on this node right now; let it finish",
            ) from None
        _held[name] = fd


def _unlock(cache: HashCache) -> None:
    with _held_lock:
        fd = _held.pop(str(cache.file.with_suffix(".lock")), None)
    if fd is not None:
        os.close(fd)


def _check_manifest(manifest: Manifest) -> None:
    bad = [f.path for f in manifest.files if not safe_relative(f.path)]
    if bad:
        raise StoreError(MODEL_IO, f"the manifest names paths outside the model: {bad[:3]}")


def _same(root: Path, rel: str, size: int, sha: str, cache: HashCache, stats: HashStats) -> bool:
    """The file at root/rel has this size and sha256 (hashed only when the size matches)."""
    path = root / rel
    try:
        if not path.is_file() or path.stat().st_size != size:
            return False
    except OSError:
        return False
    return cached_sha256(path, cache, stats) == sha


@dataclass
class _Plan:
    sizes: dict[str, int]  # every manifest file's size
    send: list[FileToSend] = field(default_factory=list)
    link: list[str] = field(default_factory=list)  # right at <path>: hard-link into staging
    truncate: dict[str, int] = field(default_factory=dict)  # staged partials cut to offset
    reused_bytes: int = 0
    staged_bytes: int = 0

    @property
    def need_bytes(self) -> int:
        return sum(self.sizes[f.path] - f.offset for f in self.send)


def prepare(req: ModelPrepare) -> ModelPrepared:
    _check_manifest(req.manifest)
    target = model_path(req.path)
    staging = staging_path(target)
    cache, stats = HashCache(target), HashStats()
    _lock(target, cache)
    try:
        return _prepare(req, target, staging, cache, stats)
    except BaseException:
        _unlock(cache)
        raise


def _prepare(
    req: ModelPrepare, target: Path, staging: Path, cache: HashCache, stats: HashStats
) -> ModelPrepared:
    try:
        if target.is_dir() and _is_current(target, req.manifest, cache, stats):
            _unlock(cache)
            cache.save()
            shutil.rmtree(staging, ignore_errors=True)  # a leftover of an earlier sync
            return ModelPrepared(
                id=req.id, path=str(target), current=True, hashed_bytes=stats.hashed_bytes
            )
        refuse_foreign(target)
        plan = _plan(target, staging, req, cache, stats)
    except ModelFileError as exc:
        raise StoreError(MODEL_IO, str(exc)) from exc
    free = disk(target.parent).free_bytes
    if plan.need_bytes > free:
        raise StoreError(
            NO_SPACE,
            f"needs {human(plan.need_bytes)} free to copy the model to {target}, but that "
            f"file system has {human(free)} free; nothing was copied",
        )
    _stage(target, staging, req.manifest, plan, cache)
    cache.save()
    return ModelPrepared(
        id=req.id,
        path=str(target),
        current=False,
        staging=str(staging),
        send=plan.send,
        reused_bytes=plan.reused_bytes,
        staged_bytes=plan.staged_bytes,
        free_bytes=free,
        hashed_bytes=stats.hashed_bytes,
    )


def _is_current(target: Path, manifest: Manifest, cache: HashCache, stats: HashStats) -> bool:
    if list_files(target) != sorted(f.path for f in manifest.files):
        return False
    return all(_same(target, f.path, f.size, f.sha256, cache, stats) for f in manifest.files)


def _plan(
    target: Path, staging: Path, req: ModelPrepare, cache: HashCache, stats: HashStats
) -> _Plan:
    plan = _Plan(sizes={f.path: f.size for f in req.manifest.files})
    for f in req.manifest.files:
        staged = staging / f.path
        if _same(staging, f.path, f.size, f.sha256, cache, stats):
            plan.staged_bytes += f.size
        elif _same(target, f.path, f.size, f.sha256, cache, stats):
            plan.link.append(f.path)
            plan.reused_bytes += f.size
        elif staged.is_file() and not staged.is_symlink() and staged.stat().st_nlink == 1:
            # (a staged file with other links shares its inode with <path>: never cut it)
            have = min(staged.stat().st_size, f.size)
            offset = max(0, have - req.resume_window)
            prefix = sha256_file(staged, offset) if offset else ""
            plan.truncate[f.path] = offset
            plan.send.append(FileToSend(path=f.path, offset=offset, prefix_sha256=prefix))
        else:
            plan.send.append(FileToSend(path=f.path, offset=0))
    return plan


def _stage(target: Path, staging: Path, manifest: Manifest, plan: _Plan, cache: HashCache) -> None:
    try:
        staging.mkdir(parents=True, exist_ok=True)
        wanted = {f.path for f in manifest.files}
        for rel in list_files(staging):
            if rel not in wanted:
                (staging / rel).unlink()
        for f in manifest.files:
            (staging / f.path).parent.mkdir(parents=True, exist_ok=True)
        for rel in plan.link:
            _link(target / rel, staging / rel, cache)
        for rel, offset in plan.truncate.items():
            os.truncate(staging / rel, offset)
        for item in plan.send:
            if item.offset == 0:
                (staging / item.path).unlink(missing_ok=True)
    except ModelFileError as exc:
        raise StoreError(MODEL_IO, str(exc)) from exc
    except OSError as exc:
        where = exc.filename or staging
        raise StoreError(
            MODEL_IO,
            f"cannot prepare {where}: {exc.strerror or exc}; check that the user "
            f"may write to {target.parent}",
        ) from exc


def _link(source: Path, dest: Path, cache: HashCache) -> None:
    """dest becomes source's content: a hard link (no bytes), or a copy across devices."""
    dest.unlink(missing_ok=True)
    known = cache.get(source.stat())
    try:
        os.link(source, dest)
    except OSError:
        shutil.copyfile(source, dest)  # finalize hashes the copy
        return
    if known is not None:  # a new link moves the inode's ctime: record it again
        cache.put(dest.stat(), known, dest)


def _cache_of(root: Path) -> HashCache:
    """The hash cache of the model at root, or of the model root stages (the same one)."""
    return HashCache(root.with_name(root.name.removesuffix(STAGING_SUFFIX)))


def remember_arrived(staging: Path, rel: str, st: os.stat_result, sha256: str) -> None:
    """A staged file's SHA-256, hashed as its bytes arrived (st: its stat after the last
    write), kept for finalize, which then reads it no second time."""
    cache = _cache_of(staging)
    cache.put(st, sha256, staging / rel)
    cache.save()


def prefix_hashes(req: ModelPrefixHash) -> PrefixHashes:
    """A range covering a whole file is hashed through the cache: the orchestrator checks
    each file as soon as it has arrived (sent by SFTP), so finalize then finds every hash
    known."""
    root = model_path(req.path)
    cache, stats = _cache_of(root), HashStats()
    out = []
    for item in req.ranges:
        if not safe_relative(item.path):
            raise StoreError(MODEL_IO, f"{item.path} is outside the model")
        path = root / item.path
        try:
            whole = path.stat().st_size == item.length
            out.append(
                cached_sha256(path, cache, stats) if whole else sha256_file(path, item.length)
            )
        except (OSError, ModelFileError) as exc:
            raise StoreError(MODEL_IO, f"cannot read {path}: {exc}") from exc
    cache.save()
    return PrefixHashes(id=req.id, sha256=out)


def finalize(req: ModelFinalize) -> ModelFinalized:
    """Verify every staged file; rename the staging directory into place."""
    _check_manifest(req.manifest)
    target = model_path(req.path)
    staging = staging_path(target)
    if not staging.is_dir():
        raise StoreError(MODEL_IO, f"nothing is staged at {staging}")
    cache, stats = HashCache(target), HashStats()
    try:
        return _finalize(req, target, staging, cache, stats)
    finally:
        _unlock(cache)


def _finalize(
    req: ModelFinalize, target: Path, staging: Path, cache: HashCache, stats: HashStats
) -> ModelFinalized:
    try:
        wanted = {f.path for f in req.manifest.files}
        for rel in list_files(staging):
            if rel not in wanted:
                (staging / rel).unlink()
        bad = [
            f.path
            for f in req.manifest.files
            if not _same(staging, f.path, f.size, f.sha256, cache, stats)
        ]
    except (OSError, ModelFileError) as exc:
        raise StoreError(MODEL_IO, f"cannot verify {staging}: {exc}") from exc
    if bad:
        for rel in bad:
            with contextlib.suppress(OSError):
                (staging / rel).unlink()
        raise StoreError(
            MODEL_MISMATCH,
            f"{', '.join(bad[:5])} in {staging} differ from the source's size or SHA-256 "
            "(removed; the next sync sends them again)",
        )
    refuse_foreign(target)  # may have appeared since prepare
    try:
        (staging / SYNC_MARKER).write_text("made by orchestrator sync; replaced by the next\n")
    except OSError as exc:
        raise StoreError(MODEL_IO, f"cannot write {staging / SYNC_MARKER}: {exc}") from exc
    _swap(target, staging)
    # Just verified, now under their final names; removing the old copy's links to the
    # same inodes moved their ctime, so record them again (else the next check rehashes).
    for f in req.manifest.files:
        with contextlib.suppress(OSError):
            cache.put((target / f.path).stat(), f.sha256, target / f.path)
    cache.save()
    return ModelFinalized(
        id=req.id, path=str(target), files=len(req.manifest.files), hashed_bytes=stats.hashed_bytes
    )


def refuse_foreign(target: Path) -> None:
    """Raise NOT_OURS unless what sits at `target` may be replaced: nothing, an empty
    directory, or a copy sync made (SYNC_MARKER inside)."""
    if not (target.exists() or target.is_symlink()):
        return
    if target.is_dir() and not target.is_symlink():
        with contextlib.suppress(OSError):
            if (target / SYNC_MARKER).is_file() or not any(target.iterdir()):
                return
    kind = "symlink" if target.is_symlink() else "directory" if target.is_dir() else "file"
    raise StoreError(
        NOT_OURS,
        f"{target} is a {kind} that sync did not make, and differs from the model; sync "
        f"replaces only its own copies, so it left {target} intact. Fix: set [model] path "
        f"to a directory of its own (e.g. {target / 'MODEL-NAME'}), or move {target} away "
        "and sync again",
    )


def _swap(target: Path, staging: Path) -> None:
    old = target.with_name(target.name + OLD_SUFFIX)
    try:
        if old.exists():
            shutil.rmtree(old)
        if target.exists() or target.is_symlink():
            target.rename(old)
        try:
            staging.rename(target)
        except OSError:
            if old.exists() and not target.exists():
                old.rename(target)  # put the previous copy back
            raise
    except OSError as exc:
        raise StoreError(
            MODEL_IO, f"cannot rename {staging} to {target}: {exc.strerror or exc}"
        ) from exc
    shutil.rmtree(old, ignore_errors=True)
