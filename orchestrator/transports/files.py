"""A node's files, through the same calls whether the node is this machine or reached by SFTP.

    async with await transport.open_files() as files:     # LocalFiles | SftpFiles
        st = await files.stat(path)                        # FileStat, or None when missing
        f = await files.open(path, "w", truncate=True)     # then f.write(data, offset),
        await f.write(data, 0)                             # f.read(size, offset), f.close()
        rename (replaces, as rename(2)), remove, link (hard), free_bytes, makedirs, listdir,
        remove_tree, put (a file of this machine), expand (a leading ~)
    await write_then_rename(files, target, fill)           # the one temporary-name-then-rename

Every failure is an OSError: over SFTP a lost connection is a ConnectionError and any other
failure an OSError whose message names the SFTP status, so callers never see asyncssh.
"""

from __future__ import annotations

import contextlib
import secrets
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Literal

MAX_WRITE = 1 << 20  # bytes per write request at most (a sync keeps several in flight)


@dataclass(frozen=True)
class FileStat:
    size: int
    is_dir: bool


class NodeFile(ABC):
    """One open file; every read and write names its offset (requests may be in flight)."""

    @abstractmethod
    async def read(self, size: int, offset: int) -> bytes:
        """Up to size bytes at offset (fewer near the end, b"" past it)."""

    @abstractmethod
    async def write(self, data: bytes, offset: int) -> None:
        """All of data at offset, as one request."""

    @abstractmethod
    async def close(self) -> None: ...


class NodeFiles(ABC):
    write_size: int  # the largest write this node takes in one request

    @abstractmethod
    async def expand(self, path: str) -> str:
        """path with a leading ~ made the node user's home."""

    @abstractmethod
    async def stat(self, path: str) -> FileStat | None:
        """None when nothing is at path."""

    @abstractmethod
    async def open(self, path: str, mode: Literal["r", "w"], *, truncate: bool = False) -> NodeFile:
        """"r": read; "w": write, creating the file (and emptying it when truncate)."""

    @abstractmethod
    async def rename(self, source: str, target: str) -> None:
        """Rename, replacing a file (or an empty directory) at target, as rename(2)."""

    @abstractmethod
    async def remove(self, path: str) -> None:
        """Remove one file."""

    @abstractmethod
    async def link(self, source: str, target: str) -> None:
        """A hard link: target names source's file."""

    @abstractmethod
    async def free_bytes(self, path: str) -> int | None:
        """Space free for us on path's file system; None when the node cannot tell."""

    @abstractmethod
    async def makedirs(self, path: str) -> None:
        """path and its parents, as needed."""

    @abstractmethod
    async def listdir(self, path: str) -> dict[str, int]:
        """Each entry's name and size."""

    @abstractmethod
    async def remove_tree(self, path: str) -> None:
        """A directory and everything under it."""

    @abstractmethod
    async def put(self, local: Path, path: str) -> None:
        """Copy a file of this machine to path."""

    async def close(self) -> None:  # noqa: B027 - nothing to release for local
        """Release the session."""

    async def __aenter__(self) -> NodeFiles:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()


PART = ".part-"  # in every temporary name: what a lost run left is recognised by it


def temporary_name(target: str) -> str:
    """A hidden name beside target, unique to this write."""
    folder, _, name = target.rpartition("/")
    return f"{folder}/.{name}{PART}{secrets.token_hex(4)}"


async def write_then_rename(
    files: NodeFiles, target: str, fill: Callable[[str], Awaitable[None]]
) -> None:
    """fill writes a file or a directory at the temporary name it is given, which is then
    renamed to target: nobody ever sees half of it at target. On any failure the
    temporary is removed (as far as the node is still reachable) and the error raised."""
    temporary = temporary_name(target)
    try:
        await fill(temporary)
        await files.rename(temporary, target)
    except BaseException:
        with contextlib.suppress(Exception):
            await discard(files, temporary)
        raise


async def write_bytes(files: NodeFiles, path: str, data: bytes) -> None:
    """A small file, whole or not at all (write_then_rename)."""

    async def fill(temporary: str) -> None:
        f = await files.open(temporary, "w", truncate=True)
        try:
            for at in range(0, len(data), files.write_size):
                await f.write(data[at : at + files.write_size], at)
        finally:
            await f.close()

    await write_then_rename(files, path, fill)


async def discard(files: NodeFiles, path: str) -> None:
    """Remove what is at path, a file or a directory; nothing there is fine."""
    found = await files.stat(path)
    if found is None:
        return
    if found.is_dir:
        await files.remove_tree(path)
    else:
        await files.remove(path)
