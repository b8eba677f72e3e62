"""Copy node_agent + serving to a node, once per content digest.

    <cache>/code/<digest>/node_agent/...     the agent runs from here:
    <cache>/code/<digest>/serving/...        cd <dir> && exec <python> -m node_agent
    <cache>/code/<digest>/CODE_DIGEST        written last: marks a complete copy

A copy goes to `<cache>/code/.tmp-<digest>-<random>/` first and is renamed into
place, so a half copy (connection lost mid-way) is never used.
"""

from __future__ import annotations

import asyncio
import secrets
import shutil
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import asyncssh

from node_agent.code_digest import DIGEST_FILE, code_digest, code_root, package_files


@dataclass(frozen=True)
class CodeBundle:
    root: Path
    files: list[str]  # POSIX paths relative to root
    digest: str

    @classmethod
    def from_local(cls, root: Path | None = None) -> CodeBundle:
        base = root or code_root()
        files = package_files(base)
        if not any(f.startswith("node_agent/") for f in files):
            raise FileNotFoundError(f"no node_agent package under {base}")
        return cls(root=base, files=files, digest=code_digest(base, files))


# ── this machine ──


def deploy_local(bundle: CodeBundle, cache_dir: Path) -> tuple[Path, int]:
    """Blocking; returns (code dir, files copied)."""
    target = cache_dir / bundle.digest
    if (target / DIGEST_FILE).is_file():
        return target, 0
    cache_dir.mkdir(parents=True, exist_ok=True)
    tmp = cache_dir / f".tmp-{bundle.digest}-{secrets.token_hex(4)}"
    try:
        for rel in bundle.files:
            dest = tmp / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(bundle.root / rel, dest)
        (tmp / DIGEST_FILE).write_text(bundle.digest + "\n")
        if target.exists() and not (target / DIGEST_FILE).is_file():
            shutil.rmtree(target)  # a leftover without its marker cannot be trusted
        try:
            tmp.rename(target)
        except OSError:
            if not (target / DIGEST_FILE).is_file():
                raise
            # else a concurrent deploy of the same digest won the race
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target, len(bundle.files)


# ── over SFTP ──


async def remote_cache_dir(sftp: asyncssh.SFTPClient, cache_dir: str) -> PurePosixPath:
    """Expand a leading ~ against the SFTP session's home (its start directory)."""
    if cache_dir == "~" or cache_dir.startswith("~/"):
        home = await sftp.realpath(".")
        return PurePosixPath(home) / cache_dir[2:]
    return PurePosixPath(cache_dir)


async def deploy_sftp(
    conn: asyncssh.SSHClientConnection, bundle: CodeBundle, cache_dir: str
) -> tuple[str, int]:
    """Returns (code dir on the node, files copied)."""
    async with conn.start_sftp_client() as sftp:
        base = await remote_cache_dir(sftp, cache_dir)
        target = base / bundle.digest
        if await sftp.exists(str(target / DIGEST_FILE)):
            return str(target), 0
        await sftp.makedirs(str(base), exist_ok=True)
        tmp = base / f".tmp-{bundle.digest}-{secrets.token_hex(4)}"
        try:
            await _upload(sftp, bundle, tmp)
            if await sftp.exists(str(target)) and not await sftp.exists(str(target / DIGEST_FILE)):
                await sftp.rmtree(str(target))
            try:
                await sftp.rename(str(tmp), str(target))
            except asyncssh.SFTPError:
                if not await sftp.exists(str(target / DIGEST_FILE)):
                    raise
        finally:
            if await sftp.exists(str(tmp)):
                await sftp.rmtree(str(tmp))
        return str(target), len(bundle.files)


async def _upload(sftp: asyncssh.SFTPClient, bundle: CodeBundle, tmp: PurePosixPath) -> None:
    dirs = sorted({str(tmp / PurePosixPath(rel).parent) for rel in bundle.files})
    await sftp.makedirs(str(tmp), exist_ok=True)
    for d in dirs:
        await sftp.makedirs(d, exist_ok=True)
    # A few dozen small files: a handful in flight at once hides the round trips.
    sem = asyncio.Semaphore(8)

    async def put(rel: str) -> None:
        async with sem:
            await sftp.put(str(bundle.root / rel), str(tmp / rel))

    await asyncio.gather(*(put(rel) for rel in bundle.files))
    async with sftp.open(str(tmp / DIGEST_FILE), "w") as f:
        await f.write(bundle.digest + "\n")
