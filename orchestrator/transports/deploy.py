"""Copy node_agent + serving to a node, once per content digest.

    <cache>/code/<digest>/node_agent/...     the agent runs from here:
    <cache>/code/<digest>/serving/...        cd <dir> && exec <python> -m node_agent
    <cache>/code/<digest>/CODE_DIGEST        written last: marks a complete copy

A copy goes to a temporary directory beside it first and is renamed into place
(files.write_then_rename), so a half copy (connection lost mid-way) is never used. The
same code deploys to this machine and over SFTP: it speaks to the node's NodeFiles.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path

from node_agent.code_digest import DIGEST_FILE, code_digest, code_root, package_files
from orchestrator.transports.files import NodeFiles, discard, write_then_rename


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


async def deploy_code(files: NodeFiles, bundle: CodeBundle, cache_dir: str) -> tuple[str, int]:
    """Returns (code dir on the node, files copied: 0 when that digest was there)."""
    base = await files.expand(cache_dir)
    target = f"{base}/{bundle.digest}"
    marker = f"{target}/{DIGEST_FILE}"
    if await files.stat(marker) is not None:
        return target, 0
    await files.makedirs(base)
    await discard(files, target)  # a leftover without its marker cannot be trusted

    async def fill(temporary: str) -> None:
        await _upload(files, bundle, temporary)

    try:
        await write_then_rename(files, target, fill)
    except OSError:
        if await files.stat(marker) is None:
            raise
        # else a concurrent deploy of the same digest won the race
    return target, len(bundle.files)


async def _upload(files: NodeFiles, bundle: CodeBundle, folder: str) -> None:
    dirs = sorted({str(Path(folder, rel).parent) for rel in bundle.files})
    await files.makedirs(folder)
    for d in dirs:
        await files.makedirs(d)
    # A few dozen small files: a handful in flight at once hides the round trips.
    sem = asyncio.Semaphore(8)

    async def put(rel: str) -> None:
        async with sem:
            await files.put(bundle.root / rel, f"{folder}/{rel}")

    await asyncio.gather(*(put(rel) for rel in bundle.files))
    marker = await files.open(f"{folder}/{DIGEST_FILE}", "w", truncate=True)
    try:
        await marker.write(f"{bundle.digest}\n".encode(), 0)
    finally:
        await marker.close()
