"""Moving model bytes: read from the source, write into a node's staging directory.

Source:  LocalSource (this machine's files)  |  NodeSource (a node's files and its agent)
Sink:    the node's NodeFiles (its transport's files: SFTP, or this machine's)
copy_file: one write request per chunk (the largest the node takes), RESUME_WINDOW bytes
           of them in flight per file (round trips hidden); a stop leaves holes only in
           a file's last RESUME_WINDOW bytes, which the agent drops before a resume
           (ModelPrepare.resume_window).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from contract.model_manifest import FileRange, ModelPrefixHash, PrefixHashes
from node_agent.models.hashes import sha256_file
from orchestrator.transports.files import NodeFile, NodeFiles
from orchestrator.transports.handle import AgentHandle
from orchestrator.transports.local_files import LocalFiles

RESUME_WINDOW = 8 << 20
PARALLEL_FILES = 4
HASH_TIMEOUT_S = 3600.0


class Source(Protocol):
    async def read(self, rel: str, offset: int, size: int) -> bytes: ...
    async def prefix_sha256(self, ranges: list[FileRange]) -> list[str]: ...
    async def close(self) -> None: ...


class FileSource:
    """Reads a model directory's files through NodeFiles, each file opened once."""

    def __init__(self, root: str, files: NodeFiles, where: str = "") -> None:
        self.root = root
        self._files = files
        self._where = where  # " on <node>" in messages
        self._open: dict[str, NodeFile] = {}
        self._lock = asyncio.Lock()

    async def read(self, rel: str, offset: int, size: int) -> bytes:
        async with self._lock:
            if rel not in self._open:
                self._open[rel] = await self._files.open(f"{self.root}/{rel}", "r")
        parts: list[bytes] = []
        got = 0
        while got < size:  # a server may answer a read with fewer bytes
            data = await self._open[rel].read(size - got, offset + got)
            if not data:
                raise OSError(f"{self.root}/{rel}{self._where} changed while it was being sent")
            parts.append(data)
            got += len(data)
        return b"".join(parts)

    async def close(self) -> None:
        for f in self._open.values():
            with contextlib.suppress(Exception):
                await f.close()
        self._open.clear()
        await self._files.close()


class LocalSource(FileSource):
    """This machine's copy: read and hashed here."""

    def __init__(self, root: Path) -> None:
        super().__init__(str(root), LocalFiles())

    async def prefix_sha256(self, ranges: list[FileRange]) -> list[str]:
        root = Path(self.root)
        return [await asyncio.to_thread(sha256_file, root / r.path, r.length) for r in ranges]


class NodeSource(FileSource):
    """A node's copy: read through its files (relayed by us), hashed by its agent."""

    def __init__(self, root: str, agent: AgentHandle, files: NodeFiles) -> None:
        super().__init__(root, files, f" on {agent.node}")
        self._agent = agent

    async def prefix_sha256(self, ranges: list[FileRange]) -> list[str]:
        request = ModelPrefixHash(path=self.root, ranges=ranges)
        return (await self._agent.request(request, PrefixHashes, HASH_TIMEOUT_S)).sha256


async def copy_file(
    source: Source,
    sink: NodeFiles,
    rel: str,
    dest: str,
    offset: int,
    size: int,
    on_bytes: Callable[[int], None],
) -> None:
    """Send rel's bytes [offset, size) to dest, RESUME_WINDOW bytes in flight."""
    chunk = sink.write_size
    depth = max(1, RESUME_WINDOW // chunk)
    writer = await sink.open(dest, "w", truncate=offset == 0)
    inflight: set[asyncio.Task[int]] = set()

    async def put(data: bytes, at: int) -> int:
        await writer.write(data, at)
        return len(data)

    async def settle(when: str) -> None:
        done, pending = await asyncio.wait(inflight, return_when=when)
        inflight.intersection_update(pending)
        errors = [error for task in done if (error := task.exception()) is not None]
        for task in done:
            if task.exception() is None:
                on_bytes(task.result())
        if errors:
            raise errors[0]

    try:
        position = offset
        while position < size:
            data = await source.read(rel, position, min(chunk, size - position))
            inflight.add(asyncio.create_task(put(data, position)))
            position += len(data)
            if len(inflight) >= depth:
                await settle(asyncio.FIRST_COMPLETED)
        if inflight:
            await settle(asyncio.ALL_COMPLETED)
    finally:
        # Writes in flight end by themselves (they fail fast once one has failed).
        await asyncio.gather(*inflight, return_exceptions=True)
        with contextlib.suppress(Exception):
            await writer.close()
