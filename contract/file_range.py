"""The file-range request of model sync's file servers (the head's TLS listener, a
forwarding node's relay): one JSON line `{"token", "path", "offset", "length"}`, answered
`OK\\n` and the bytes, or `ERR <why>\\n`. Both servers check it here, alike."""

from __future__ import annotations

import hmac
import json
import socket
from collections.abc import Collection

MAX_REQUEST = 64 << 10  # a request line's bytes at most


def read_line(sock: socket.socket) -> bytes:
    """One line, byte by byte (what follows it stays in the socket for the caller)."""
    line = bytearray()
    while not line.endswith(b"\n") and len(line) < MAX_REQUEST:
        byte = sock.recv(1)
        if not byte:
            break
        line += byte
    return bytes(line)


def check_request(
    line: bytes, token: str, files: Collection[str]
) -> tuple[str, int, int] | bytes:
    """(path, offset, length) of a well-formed request for a served file with the right
    token (compared in constant time); else the ERR line to answer."""
    try:
        ask = json.loads(line[:MAX_REQUEST])
        given, rel = str(ask["token"]), str(ask["path"])
        offset, length = int(ask["offset"]), int(ask["length"])
    except (ValueError, KeyError, TypeError):
        return b"ERR malformed request\n"
    if not hmac.compare_digest(given.encode(), token.encode()):
        return b"ERR wrong token\n"
    if rel not in files or offset < 0 or length < 0:
        return b"ERR not served\n"
    return rel, offset, length
