"""NodeFiles over SFTP, on the node's SSH connection (one SFTP session per open_files()).

Each read and write is one SFTP request of our own (asyncssh's `block_size=0`): asyncssh's
parallel reader and writer would split it into requests of their own, and leave those
behind, unobserved, when the connection drops. Callers keep several in flight instead.

asyncssh's errors end here: a lost session becomes a ConnectionError, any other SFTP
failure an SftpError (an OSError) whose message names the SFTP status.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import stat
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import Literal

import asyncssh

from orchestrator.transports.files import MAX_WRITE, FileStat, NodeFile, NodeFiles

SFTP_MIN_WRITE = 32 << 10  # every SFTP server takes this much (draft-ietf-secsh-filexfer)
log = logging.getLogger("orchestrator.transports")


class SftpError(OSError):
    """An SFTP request failed (not the connection): the message names the SFTP status."""


@contextlib.contextmanager
def os_errors() -> Iterator[None]:
    """asyncssh's exceptions as OSErrors (module docstring)."""
    try:
        yield
    except asyncssh.SFTPError as exc:
        text = f"SFTP {type(exc).__name__.removeprefix('SFTP')}: {exc.reason}"
        if isinstance(exc, asyncssh.SFTPConnectionLost | asyncssh.SFTPNoConnection):
            raise ConnectionError(text) from exc
        raise SftpError(text) from exc
    except asyncssh.Error as exc:
        raise ConnectionError(str(exc) or type(exc).__name__) from exc


class SftpFile(NodeFile):
    def __init__(self, f: asyncssh.SFTPClientFile) -> None:
        self._f = f

    async def read(self, size: int, offset: int) -> bytes:
        with os_errors():
            data = await self._f.read(size, offset)
        return data if isinstance(data, bytes) else b""

    async def write(self, data: bytes, offset: int) -> None:
        with os_errors():
            await self._f.write(data, offset)

    async def close(self) -> None:
        with os_errors():
            await self._f.close()


class SftpFiles(NodeFiles):
    def __init__(self, sftp: asyncssh.SFTPClient) -> None:
        self._sftp = sftp
        # OpenSSH announces 255 KiB (limits@openssh.com); asyncssh assumes less otherwise.
        self.write_size = min(max(sftp.limits.max_write_len, SFTP_MIN_WRITE), MAX_WRITE)

    @classmethod
    async def start(cls, conn: asyncssh.SSHClientConnection) -> SftpFiles:
        with os_errors():
            return cls(await conn.start_sftp_client())

    async def expand(self, path: str) -> str:
        # The SFTP session starts in the user's home.
        if path == "~" or path.startswith("~/"):
            with os_errors():
                home = await self._sftp.realpath(".")
            return str(PurePosixPath(home) / path[2:])
        return path

    async def stat(self, path: str) -> FileStat | None:
        try:
            with os_errors():
                attrs = await self._sftp.stat(path)
        except SftpError as exc:
            if isinstance(exc.__cause__, asyncssh.SFTPNoSuchFile):
                return None
            raise
        is_dir = attrs.permissions is not None and stat.S_ISDIR(attrs.permissions)
        return FileStat(size=attrs.size or 0, is_dir=is_dir)

    async def open(self, path: str, mode: Literal["r", "w"], *, truncate: bool = False) -> NodeFile:
        flags = asyncssh.FXF_READ
        if mode == "w":
            flags = asyncssh.FXF_WRITE | asyncssh.FXF_CREAT
            flags |= asyncssh.FXF_TRUNC if truncate else 0
        with os_errors():
            return SftpFile(await self._sftp.open(path, flags, encoding=None, block_size=0))

    async def rename(self, source: str, target: str) -> None:
        with os_errors():
            try:
                await self._sftp.posix_rename(source, target)
            except asyncssh.SFTPOpUnsupported:  # a server without posix-rename@openssh.com
                if await self._sftp.exists(target):
                    await self._sftp.remove(target)
                await self._sftp.rename(source, target)

    async def remove(self, path: str) -> None:
        with os_errors():
            await self._sftp.remove(path)

    async def link(self, source: str, target: str) -> None:
        with os_errors():
            await self._sftp.link(source, target)

    async def free_bytes(self, path: str) -> int | None:
        try:
            st = await self._sftp.statvfs(path)
        except (asyncssh.Error, OSError):
            return None
        return st.bavail * st.frsize

    async def makedirs(self, path: str) -> None:
        with os_errors():
            await self._sftp.makedirs(path, exist_ok=True)

    async def listdir(self, path: str) -> dict[str, int]:
        with os_errors():
            entries = await self._sftp.readdir(path)
        names = {_text(entry.filename): entry.attrs.size or 0 for entry in entries}
        return {name: size for name, size in names.items() if name not in (".", "..")}

    async def remove_tree(self, path: str) -> None:
        with os_errors():
            await self._sftp.rmtree(path)

    async def put(self, local: Path, path: str) -> None:
        with os_errors():
            await self._sftp.put(str(local), path)

    async def close(self) -> None:
        with contextlib.suppress(Exception):  # a lost connection has nothing left to close
            self._sftp.exit()
            await self._sftp.wait_closed()


def _text(value: object) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def quiet_lost_connections(loop: asyncio.AbstractEventLoop, context: dict[str, object]) -> None:
    """An event loop exception handler. asyncssh's parallel SFTP writes (put) leave their
    sibling tasks' ConnectionLost unretrieved when a node drops; that node's failure is
    reported by its caller already, without a traceback."""
    if isinstance(context.get("exception"), asyncssh.Error | ConnectionError):
        log.debug("after a lost connection: %s", context.get("message"))
        return
    loop.default_exception_handler(context)
