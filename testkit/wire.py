"""What crosses a network link, as bytes: an AF_PACKET raw socket on one interface of this
(root) namespace, read in a thread until stopped. Linux and root only."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator

ETH_P_ALL = 0x0003


class Capture:
    def __init__(self) -> None:
        self.frames: list[bytes] = []

    @property
    def data(self) -> bytes:
        return b"".join(self.frames)


@contextlib.contextmanager
def capture(interface: str) -> Iterator[Capture]:
    """Every frame sent or received on `interface` while the block runs."""
    sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
    sock.bind((interface, 0))
    sock.settimeout(0.1)
    seen, stop = Capture(), threading.Event()

    def read() -> None:
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                seen.frames.append(sock.recv(65535))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        yield seen
    finally:
        stop.set()
        reader.join(5)
        sock.close()
