"""The agent's protocol channel on stdin/stdout, kept apart from everything else.

fds 0 and 1 are duplicated for the protocol, then fd 0 is pointed at /dev/null
and fd 1 at stderr: a stray print() (ours or a library's) lands in the log
instead of corrupting the JSON stream, and no child can inherit the channel.

Pipes and sockets (the SSH channel, the local transport) are read and written
by the event loop. A regular file or a tty (someone trying the agent by hand)
falls back to a reader thread and blocking writes.
"""

from __future__ import annotations

import asyncio
import os
import stat
import threading
from typing import Protocol


class LineWriter(Protocol):
    def write(self, data: bytes) -> None: ...
    async def drain(self) -> None: ...
    def is_closing(self) -> bool: ...
    def close(self) -> None: ...
    async def wait_closed(self) -> None: ...


class _BlockingWriter:
    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._closed = False

    def write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(self._fd, view) :]

    async def drain(self) -> None:
        return None

    def is_closing(self) -> bool:
        return self._closed

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            os.close(self._fd)

    async def wait_closed(self) -> None:
        return None


def _is_stream(fd: int) -> bool:
    mode = os.fstat(fd).st_mode
    return stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)


def _feed_from_thread(
    fd: int, reader: asyncio.StreamReader, loop: asyncio.AbstractEventLoop
) -> None:
    def run() -> None:
        with os.fdopen(fd, "rb", buffering=0) as f:
            for line in f:
                loop.call_soon_threadsafe(reader.feed_data, line)
        loop.call_soon_threadsafe(reader.feed_eof)

    threading.Thread(target=run, name="stdin-reader", daemon=True).start()


async def open_protocol_stdio(limit: int) -> tuple[asyncio.StreamReader, LineWriter]:
    in_fd, out_fd = os.dup(0), os.dup(1)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    os.dup2(2, 1)
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=limit)
    if _is_stream(in_fd):
        await loop.connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(in_fd, "rb", buffering=0)
        )
    else:
        _feed_from_thread(in_fd, reader, loop)
    if not _is_stream(out_fd):
        return reader, _BlockingWriter(out_fd)
    transport, proto = await loop.connect_write_pipe(
        asyncio.streams.FlowControlMixin, os.fdopen(out_fd, "wb", buffering=0)
    )
    return reader, asyncio.StreamWriter(transport, proto, None, loop)
