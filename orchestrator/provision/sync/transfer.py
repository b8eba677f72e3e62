"""Moving model bytes: read from the source, write into a node's staging directory.

Source:  LocalSource (this machine's files)  |  NodeSource (a node's files by SFTP)
Sink:    SftpSink (a node over its SSH connection)  |  LocalSink (this machine)
copy_file: one SFTP write request per chunk (the server's largest), RESUME_WINDOW bytes
           of them in flight per file (round trips hidden); a stop leaves holes only in
           a file's last RESUME_WINDOW bytes, which the agent drops before a resume
           (ModelPrepare.resume_window).

Each chunk is one request of our own (asyncssh's `block_size=0`): asyncssh's parallel
writer would split it into requests of its own, and leaves those behind, unobserved,
when the connection drops.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import Protocol

import asyncssh

from contract.model_manifest import FileRange, ModelPrefixHash, PrefixHashes
from node_agent.model_hashes import sha256_file
from orchestrator.transports.handle import AgentHandle

RESUME_WINDOW = 8 << 20
LOCAL_CHUNK = 1 << 20
SFTP_MIN_WRITE = 32 << 10  # every SFTP server takes this much (draft-ietf-secsh-filexfer)
PARALLEL_FILES = 4
HASH_TIMEOUT_S = 3600.0


class Source(Protocol):
    async def read(self, rel: str, offset: int, size: int) -> bytes: ...
    async def prefix_sha256(self, ranges: list[FileRange]) -> list[str]: ...
    async def close(self) -> None: ...


class FileWriter(Protocol):
    async def write(self, data: bytes, offset: int) -> None: ...
    async def close(self) -> None: ...


class Sink(Protocol):
    write_size: int  # bytes per write request

    async def open(self, path: str, truncate: bool) -> FileWriter: ...
    async def free_bytes(self, path: str) -> int | None: ...
    async def close(self) -> None: ...


class LocalSource:
    def __init__(self, root: Path) -> None:
        self.root = root
        self._fds: dict[str, int] = {}

    def _fd(self, rel: str) -> int:
        if rel not in self._fds:
            self._fds[rel] = os.open(self.root / rel, os.O_RDONLY)
        return self._fds[rel]

    async def read(self, rel: str, offset: int, size: int) -> bytes:
        data = await asyncio.to_thread(os.pread, self._fd(rel), size, offset)
        if len(data) != size:
            raise OSError(f"{self.root / rel} changed size while it was being sent")
        return data

    async def prefix_sha256(self, ranges: list[FileRange]) -> list[str]:
        return [await asyncio.to_thread(sha256_file, self.root / r.path, r.length) for r in ranges]

    async def close(self) -> None:
        for fd in self._fds.values():
            with contextlib.suppress(OSError):
                os.close(fd)
        self._fds.clear()


class NodeSource:
    """A node's copy as the source: its agent hashes, SFTP reads (relayed by us)."""

    def __init__(self, root: str, agent: AgentHandle, sftp: asyncssh.SFTPClient) -> None:
        self.root = PurePosixPath(root)
        self._agent = agent
        self._sftp = sftp
        self._files: dict[str, asyncssh.SFTPClientFile] = {}
        self._lock = asyncio.Lock()

    async def read(self, rel: str, offset: int, size: int) -> bytes:
        async with self._lock:
            if rel not in self._files:  # one request per read (see the module's note)
                path = str(self.root / rel)
                self._files[rel] = await self._sftp.open(path, "rb", encoding=None, block_size=0)
        parts: list[bytes] = []
        got = 0
        while got < size:  # a server may answer a read with fewer bytes
            data = await self._files[rel].read(size - got, offset + got)
            if not isinstance(data, bytes) or not data:
                raise OSError(f"{self.root / rel} on {self._agent.node} changed while being sent")
            parts.append(data)
            got += len(data)
        return b"".join(parts)

    async def prefix_sha256(self, ranges: list[FileRange]) -> list[str]:
        request = ModelPrefixHash(path=str(self.root), ranges=ranges)
        return (await self._agent.request(request, PrefixHashes, HASH_TIMEOUT_S)).sha256

    async def close(self) -> None:
        for f in self._files.values():
            with contextlib.suppress(Exception):
                await f.close()
        self._sftp.exit()


class _SftpWriter:
    def __init__(self, f: asyncssh.SFTPClientFile) -> None:
        self._f = f

    async def write(self, data: bytes, offset: int) -> None:
        await self._f.write(data, offset)

    async def close(self) -> None:
        await self._f.close()


class SftpSink:
    def __init__(self, sftp: asyncssh.SFTPClient) -> None:
        self._sftp = sftp
        # OpenSSH announces 255 KiB (limits@openssh.com); asyncssh assumes less otherwise.
        self.write_size = min(max(sftp.limits.max_write_len, SFTP_MIN_WRITE), LOCAL_CHUNK)

    async def open(self, path: str, truncate: bool) -> FileWriter:
        flags = asyncssh.FXF_WRITE | asyncssh.FXF_CREAT | (asyncssh.FXF_TRUNC if truncate else 0)
        return _SftpWriter(await self._sftp.open(path, flags, encoding=None, block_size=0))

    async def free_bytes(self, path: str) -> int | None:
        try:
            st = await self._sftp.statvfs(path)
        except (asyncssh.Error, OSError):
            return None
        return st.bavail * st.frsize

    async def close(self) -> None:
        self._sftp.exit()


class _LocalWriter:
    def __init__(self, fd: int) -> None:
        self._fd = fd

    async def write(self, data: bytes, offset: int) -> None:
        await asyncio.to_thread(os.pwrite, self._fd, data, offset)

    async def close(self) -> None:
        os.close(self._fd)


class LocalSink:
    write_size = LOCAL_CHUNK

    async def open(self, path: str, truncate: bool) -> FileWriter:
        flags = os.O_WRONLY | os.O_CREAT | (os.O_TRUNC if truncate else 0)
        return _LocalWriter(os.open(path, flags, 0o644))

    async def free_bytes(self, path: str) -> int | None:
        try:
            st = os.statvfs(path)
        except OSError:
            return None
        return st.f_bavail * st.f_frsize

    async def close(self) -> None:
        return None


async def copy_file(
    source: Source,
    sink: Sink,
    rel: str,
    dest: str,
    offset: int,
    size: int,
    on_bytes: Callable[[int], None],
) -> None:
    """Send rel's bytes [offset, size) to dest, RESUME_WINDOW bytes in flight."""
    chunk = sink.write_size
    depth = max(1, RESUME_WINDOW // chunk)
    writer = await sink.open(dest, truncate=offset == 0)
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
