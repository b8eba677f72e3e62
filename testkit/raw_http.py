"""HTTP as a hostile client sends it: connections held half-sent, over raw sockets; and an
ASGI app on a real uvicorn server (with a given protocol class) in a thread of its own."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import uvicorn


@contextlib.contextmanager
def on_uvicorn(app: Any, **options: Any) -> Iterator[tuple[str, int]]:
    """`app` served on 127.0.0.1 (uvicorn.Config's `options`); yields (host, port)."""
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning",
                                           **options))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "uvicorn did not start"
        time.sleep(0.02)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield "127.0.0.1", port
    finally:
        server.should_exit = True
        thread.join(10)


def half_sent(host: str, port: int, count: int, data: bytes) -> list[socket.socket]:
    """`count` connections that each sent `data` (half a request) and then nothing."""
    held = []
    for _ in range(count):
        sock = socket.create_connection((host, port), timeout=5)
        sock.sendall(data)
        held.append(sock)
    return held


HALF_HEAD = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: applic"


def half_body(path: str, length: int = 1000) -> bytes:
    """A whole head announcing `length` bytes of body, and only a few of them."""
    return (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {length}\r\n\r\n{{\"model\":").encode()


def closed_by_server(held: list[socket.socket], within_s: float) -> int:
    """How many of `held` the server closed (EOF or reset) within `within_s`; closes all."""
    deadline = time.monotonic() + within_s
    closed = 0
    for sock in held:
        sock.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            while sock.recv(65536):
                pass  # an error answer before the close (431, 408) is read past
            closed += 1
        except TimeoutError:
            pass  # still open
        except OSError:
            closed += 1  # reset
        sock.close()
    return closed
