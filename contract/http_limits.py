"""The connection limits both HTTP servers share (the gateway and rank 0's internal API).

A client that opens connections and sends nothing, or half a request head, would hold a
file descriptor each for as long as it liked (macOS gives a process 256 by default):
uvicorn closes an idle keep-alive connection, and answers 503 once too many are open, but
has no deadline for a request's head nor a cap on its size with its C parser (httptools).
`HeadDeadline` adds both to uvicorn's protocol class; each server mixes it into that class
(contract imports no uvicorn: the servers' packages each do).

    connection made / response sent ─▶ HEAD_TIMEOUT_S to send a whole request head,
    at most MAX_HEAD_BYTES of it ─▶ else the connection is closed (431 if too large)
"""

from __future__ import annotations

import asyncio
import contextlib
import resource
from typing import Any

HEAD_TIMEOUT_S = 5.0  # from connecting (or the last response) to a request's whole head
KEEP_ALIVE_S = 5  # an idle connection between requests (uvicorn's timeout_keep_alive)
MAX_HEAD_BYTES = 64 * 1024  # a request line and headers; clients send a few KiB at most
MAX_CONNECTIONS = 1000  # uvicorn's limit_concurrency: beyond it, new requests get a 503
WANTED_FILES = 4096  # RLIMIT_NOFILE raised towards this: MAX_CONNECTIONS plus the rest

_TOO_LARGE = (b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: text/plain\r\n"
              b"content-length: 31\r\nconnection: close\r\n\r\nrequest head larger than 64 KiB")


class HeadDeadline:
    """Mixed into uvicorn's HttpToolsProtocol (first in the bases): while the connection
    waits for a request head, a deadline and a byte cap apply."""

    head_timeout_s = HEAD_TIMEOUT_S
    max_head_bytes = MAX_HEAD_BYTES
    transport: Any
    loop: asyncio.AbstractEventLoop
    _head_timer: asyncio.TimerHandle | None = None
    _head_bytes = 0

    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)  # type: ignore[misc]
        self._await_head()

    def data_received(self, data: bytes) -> None:
        waiting = self._head_timer is not None
        if waiting:
            self._head_bytes += len(data)
        super().data_received(data)  # type: ignore[misc]
        if self._head_timer is not None and self._head_bytes > self.max_head_bytes:
            self._stop_waiting()
            if not self.transport.is_closing():
                self.transport.write(_TOO_LARGE)
                self.transport.close()

    def on_headers_complete(self) -> None:
        self._stop_waiting()  # the head is whole: the app's own timeouts apply from here
        super().on_headers_complete()  # type: ignore[misc]

    def on_response_complete(self) -> None:
        super().on_response_complete()  # type: ignore[misc]
        if not self.transport.is_closing():
            self._await_head()

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_waiting()
        super().connection_lost(exc)  # type: ignore[misc]

    def _await_head(self) -> None:
        self._stop_waiting()
        self._head_bytes = 0
        self._head_timer = self.loop.call_later(self.head_timeout_s, self._head_expired)

    def _stop_waiting(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_expired(self) -> None:
        self._head_timer = None
        cycle = getattr(self, "cycle", None)
        if cycle is not None and not cycle.response_complete:
            return  # a pipelined request, whole, is being answered
        if not self.transport.is_closing():
            self.transport.close()  # no answer: a client this slow is not reading one


def raise_file_limit(wanted: int = WANTED_FILES) -> int:
    """The soft RLIMIT_NOFILE raised towards `wanted` (never above the hard limit, never
    lowered): room for MAX_CONNECTIONS. Returns the soft limit in effect."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        with contextlib.suppress(ValueError, OSError):  # macOS may refuse above OPEN_MAX
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def server_options() -> dict[str, Any]:
    """uvicorn.Config's arguments for these limits (besides the protocol class)."""
    return {"timeout_keep_alive": KEEP_ALIVE_S, "limit_concurrency": MAX_CONNECTIONS}
