"""The head serves its model files to the nodes' agents over TLS; each agent fetches.

    head (this process)                              node agent (ModelFetch, tls_cert)
    TLS listener on the address the node reaches     one TLS connection per file,
    us at, port 0, a certificate made for this  ◀══  the certificate pinned (sent over the
    sync only (pinned by the agents)                  agent's SSH channel), a token per sync
    ▶ "OK\\n" + the file's bytes                       ─▶ <path>.partial-sync/<file>

Why not SFTP: asyncssh encrypts and frames every 32 KB SSH packet in Python, one core
for every node's bytes (measured: the head's process was the bottleneck, 0.5x rsync on
3 hosts); here OpenSSL encrypts whole megabytes per call and each node's agent decrypts
on its own machine. The address: the head's end of a cable to the node ([[links]]) when
the head is a node on the ring (the fast link, not the LAN), else the address this
machine's routes pick towards the node's SSH host. The manifest check at the node
(ModelFinalize) is unchanged; a node that cannot connect back is pushed by SFTP.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import socket
import socketserver
import ssl
import tempfile
import threading
from pathlib import Path

from contract.file_range import check_request, read_line
from orchestrator.config import ClusterSpec, NodeSpec
from orchestrator.tls import self_signed

CHUNK = 1 << 20
REQUEST_TIMEOUT_S = 30.0


def head_address(spec: ClusterSpec, node: NodeSpec) -> str:
    """Where node reaches this machine: a cable from a local node to it, else our route's
    source address towards its SSH host."""
    local = {n.name for n in spec.nodes if n.transport == "local"}
    for link in spec.links:
        if node.name in link.between and link.ips:
            other = link.between[1 - link.between.index(node.name)]
            if other in local:
                return link.ips[link.between.index(other)]
    host = node.ssh_host or "127.0.0.1"
    for family, _, _, _, address in socket.getaddrinfo(host, node.ssh_port, type=socket.SOCK_DGRAM):
        with socket.socket(family, socket.SOCK_DGRAM) as probe:  # connect() sends nothing
            try:
                probe.connect(address)
            except OSError:
                continue
            return str(probe.getsockname()[0])
    raise OSError(f"this machine has no route to {host}")


def _certificate() -> tuple[bytes, bytes]:
    """(key PEM, certificate PEM): a self-signed certificate for this sync only."""
    return self_signed("mlxco-sync")


def _server_context(key_pem: bytes, cert_pem: bytes) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_3
    with tempfile.TemporaryDirectory(prefix="mlxco-sync-tls-") as tmp:  # 0700
        key, cert = Path(tmp) / "key.pem", Path(tmp) / "cert.pem"
        key.write_bytes(key_pem)
        cert.write_bytes(cert_pem)
        context.load_cert_chain(cert, key)
    return context


class HeadServer:
    """This machine's model directory, served over TLS to agents presenting the token: a
    thread per connection with a blocking socket (OpenSSL encrypts without the GIL; the
    event loop, which also talks to every agent, stays free)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.token = secrets.token_hex(32)
        key_pem, cert_pem = _certificate()
        self.cert_pem = cert_pem.decode()
        self._context = _server_context(key_pem, cert_pem)
        self._servers: dict[str, socketserver.ThreadingTCPServer] = {}
        self._lock = asyncio.Lock()
        self.files: frozenset[str] = frozenset()

    async def port(self, host: str) -> int:
        """The port of our listener on host (started on first use)."""
        async with self._lock:
            if host not in self._servers:
                self._servers[host] = await asyncio.to_thread(self._listen, host)
        return int(self._servers[host].server_address[1])

    def _listen(self, host: str) -> socketserver.ThreadingTCPServer:
        head = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                head._serve_one(self.request)

        server_class = _Server6 if ":" in host else _Server
        server = server_class((host, 0), Handler)
        serve = threading.Thread(  # a short poll: close() waits for it
            target=server.serve_forever, args=(0.05,), name=f"sync-serve {host}", daemon=True
        )
        serve.start()
        return server

    async def close(self) -> None:
        servers, self._servers = list(self._servers.values()), {}
        for server in servers:
            await asyncio.to_thread(server.shutdown)
            server.server_close()

    def _serve_one(self, raw: socket.socket) -> None:
        raw.settimeout(REQUEST_TIMEOUT_S)
        try:
            with self._context.wrap_socket(raw, server_side=True) as conn:
                ask = check_request(read_line(conn), self.token, self.files)
                if isinstance(ask, bytes):
                    conn.sendall(ask)
                    return
                rel, offset, length = ask
                _send_range(self.root / rel, offset, length, conn)
        except OSError:
            pass  # the agent sees a short file (or no TLS) and says so


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    block_on_close = False


class _Server6(_Server):
    address_family = socket.AF_INET6


def _send_range(path: Path, offset: int, length: int, conn: socket.socket) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError as exc:
        conn.sendall(f"ERR cannot read {path} on the head: {exc.strerror}\n".encode())
        return
    try:
        conn.sendall(b"OK\n")
        position, end = offset, offset + length
        while position < end:
            data = os.pread(fd, min(CHUNK, end - position), position)
            if not data:
                return  # the file shrank: the agent reports the short file
            conn.sendall(data)
            position += len(data)
    finally:
        os.close(fd)
