"""NodeFiles on this machine: the `local` transport's files, and a sync's local source.

Reads, writes and copies run in a thread (a model file's MiB at a time must not stall
the event loop); the rest are single system calls.
"""

from __future__ import annotations

import asyncio
import os
import shutil
from pathlib import Path
from typing import Literal

from orchestrator.transports.files import MAX_WRITE, FileStat, NodeFile, NodeFiles


class LocalFile(NodeFile):
    def __init__(self, fd: int) -> None:
        self._fd = fd

    async def read(self, size: int, offset: int) -> bytes:
        return await asyncio.to_thread(os.pread, self._fd, size, offset)

    async def write(self, data: bytes, offset: int) -> None:
        await asyncio.to_thread(os.pwrite, self._fd, data, offset)

    async def close(self) -> None:
        os.close(self._fd)


class LocalFiles(NodeFiles):
    write_size = MAX_WRITE

    async def expand(self, path: str) -> str:
        return os.path.expanduser(path)

    async def stat(self, path: str) -> FileStat | None:
        try:
            st = os.stat(path)
        except FileNotFoundError:
            return None
        return FileStat(size=st.st_size, is_dir=os.path.isdir(path))

    async def open(self, path: str, mode: Literal["r", "w"], *, truncate: bool = False) -> NodeFile:
        if mode == "r":
            return LocalFile(os.open(path, os.O_RDONLY))
        flags = os.O_WRONLY | os.O_CREAT | (os.O_TRUNC if truncate else 0)
        return LocalFile(os.open(path, flags, 0o644))

    async def rename(self, source: str, target: str) -> None:
        os.replace(source, target)

    async def remove(self, path: str) -> None:
        os.unlink(path)

    async def link(self, source: str, target: str) -> None:
        os.link(source, target)

    async def free_bytes(self, path: str) -> int | None:
        try:
            st = os.statvfs(path)
        except OSError:
            return None
        return st.f_bavail * st.f_frsize

    async def makedirs(self, path: str) -> None:
        os.makedirs(path, exist_ok=True)

    async def listdir(self, path: str) -> dict[str, int]:
        with os.scandir(path) as entries:
            return {entry.name: entry.stat().st_size for entry in entries}

    async def remove_tree(self, path: str) -> None:
        await asyncio.to_thread(shutil.rmtree, path)

    async def put(self, local: Path, path: str) -> None:
        await asyncio.to_thread(shutil.copyfile, local, path)
