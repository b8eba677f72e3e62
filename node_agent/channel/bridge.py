"""`python -m node_agent.channel.bridge SOCKET`: the SSH exec channel's way to a running agent.

A new orchestrator runs this over SSH instead of starting an agent: it relays stdin to
the agent's Unix socket and the socket to stdout, bytes as they come, so the agent
protocol (JSON lines) is spoken end to end as on a fresh agent's stdio.

Exit status: 0 once the agent closed the connection; NO_AGENT (10) when no agent
listens there (a stale socket was removed: start a fresh agent); REFUSED (11) when the
socket is not this user's (stderr says why; nothing was connected to or removed).
"""

from __future__ import annotations

import os
import socket
import sys
import threading

from node_agent.channel.unix_socket import SocketRefused, checked_path, remove_if_stale

NO_AGENT = 10
REFUSED = 11
CHUNK = 1 << 16


def _pump_stdin(sock: socket.socket) -> None:
    while data := os.read(0, CHUNK):
        try:
            sock.sendall(data)
        except OSError:
            return
    try:
        sock.shutdown(socket.SHUT_WR)  # the orchestrator's EOF, passed on
    except OSError:
        return


def relay(path_text: str) -> int:
    try:
        path = checked_path(path_text)
    except SocketRefused as exc:
        sys.stderr.write(f"node_agent.channel.bridge: {exc}\n")
        return REFUSED
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(str(path))
    except (ConnectionRefusedError, FileNotFoundError):
        sock.close()
        remove_if_stale(path)
        return NO_AGENT
    threading.Thread(target=_pump_stdin, args=(sock,), daemon=True).start()
    while data := sock.recv(CHUNK):
        view = memoryview(data)
        while view:
            view = view[os.write(1, view) :]
    sock.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        sys.stderr.write("usage: python -m node_agent.channel.bridge SOCKET\n")
        return 2
    try:
        return relay(args[0])
    except BrokenPipeError:  # the orchestrator's side closed first
        return 0


if __name__ == "__main__":
    sys.exit(main())
