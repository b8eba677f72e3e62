"""Forwarding a model along the ring: one agent serves its verified files, the next fetches.

    holder (ModelServe)                              receiver (ModelFetch)
    listener on its link address, port 0   ◀══TCP══  one connection per file:
    ◀ {"token", "path", "offset", "length"}\\n         request line, then
    ▶ "OK\\n" + the bytes  |  "ERR <why>\\n"            the bytes into <path>.partial-sync

Plain TCP: nodes hold no SSH credentials to each other, and the link between neighbours
is a cable. What protects it: a random token per transfer (compared in constant time),
only the named files of the model directory are served, and the receiver hashes every
byte as it writes it: the orchestrator checks each file's SHA-256 against the manifest,
and ModelFinalize checks them all again (from the node's hash cache) before the copy is
renamed into place.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import hashlib
import json
import os
import socket
import ssl
import time
from dataclasses import dataclass
from pathlib import Path

from contract.file_range import check_request, read_line
from contract.model_manifest import (
    MODEL_IO,
    NO_SPACE,
    SENDER_UNREACHABLE,
    FetchFile,
    ModelFetch,
    ModelFetched,
    ModelServe,
    ModelServing,
    safe_relative,
)
from node_agent.models.hashes import ModelFileError, sha256_prefix
from node_agent.models.store import StoreError, model_path, remember_arrived, staging_path

PARALLEL_FILES = 4
CHUNK = 1 << 20
# A listener nobody connected to for this long is closed (its orchestrator went away
# before ModelServe(close=True)); a receiver opens one connection per file.
IDLE_CLOSE_S = 600.0


@dataclass
class _Serving:
    roots: list[Path]  # looked in, in order
    token: str
    files: frozenset[str]
    server: asyncio.Server
    active: int = 0
    last: float = 0.0
    watch: asyncio.Task[None] | None = None


_serving: dict[str, _Serving] = {}  # by token


async def serve(req: ModelServe) -> ModelServing:
    if req.close:
        entry = _serving.pop(req.token, None)
        if entry is not None:
            entry.server.close()
        return ModelServing(id=req.id, port=0)
    if len(req.token) < 32:
        raise StoreError(MODEL_IO, "a forwarding token must have at least 32 characters")
    root = model_path(req.path)
    roots = [staging_path(root), root] if req.staging else [root]
    # A holder still receiving may not have begun yet: each file is asked for only once
    # the head knows it is held, and one missing then is refused by itself.
    if not req.staging and not root.is_dir():
        raise StoreError(MODEL_IO, f"{root} is not a directory on this node: nothing to serve")
    bad = [f for f in req.files if not safe_relative(f)]
    if bad:
        raise StoreError(MODEL_IO, f"cannot serve paths outside the model: {bad[:3]}")
    entry = _Serving(roots, req.token, frozenset(req.files), None)  # type: ignore[arg-type]
    try:
        entry.server = await asyncio.start_server(lambda r, w: _serve_one(entry, r, w), req.host, 0)
    except OSError as exc:
        raise StoreError(
            MODEL_IO, f"cannot listen on {req.host} to forward the model: {exc.strerror or exc}"
        ) from exc
    _serving[req.token] = entry
    entry.last = time.monotonic()
    entry.watch = asyncio.get_running_loop().create_task(_close_when_idle(entry))
    port = entry.server.sockets[0].getsockname()[1]
    return ModelServing(id=req.id, port=int(port))


async def _close_when_idle(entry: _Serving) -> None:
    while _serving.get(entry.token) is entry:
        await asyncio.sleep(min(IDLE_CLOSE_S, 30.0))
        if entry.active == 0 and time.monotonic() - entry.last > IDLE_CLOSE_S:
            _serving.pop(entry.token, None)
            entry.server.close()


async def _serve_one(
    entry: _Serving, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> None:
    entry.active += 1
    try:
        line = await asyncio.wait_for(reader.readline(), 30.0)
        ask = check_request(line, entry.token, entry.files)
        if isinstance(ask, bytes):
            writer.write(ask)
            return
        rel, offset, length = ask
        await _send_range([r / rel for r in entry.roots], offset, length, writer)
    except (OSError, TimeoutError):
        pass  # the receiver sees a short file and reports it
    finally:
        entry.active -= 1
        entry.last = time.monotonic()
        with contextlib.suppress(OSError):
            writer.close()
            await writer.wait_closed()


async def _send_range(
    paths: list[Path], offset: int, length: int, writer: asyncio.StreamWriter
) -> None:
    """The first of paths that opens (staging, then the copy it was renamed to)."""
    for path in paths:
        try:
            f = path.open("rb")
            break
        except FileNotFoundError:
            continue
        except OSError as exc:
            writer.write(f"ERR cannot read {path}: {exc.strerror}\n".encode())
            return
    else:
        writer.write(f"ERR {paths[-1]} does not exist\n".encode())
        return
    with f:
        writer.write(b"OK\n")
        await writer.drain()
        loop = asyncio.get_running_loop()
        await loop.sendfile(writer.transport, f, offset, length)


async def fetch(req: ModelFetch) -> ModelFetched:
    staging = model_path(req.staging)
    if not staging.is_dir():
        raise StoreError(MODEL_IO, f"nothing is being staged at {staging} (send ModelPrepare)")
    bad = [f.path for f in req.files if not safe_relative(f.path)]
    if bad:
        raise StoreError(MODEL_IO, f"cannot fetch paths outside the model: {bad[:3]}")
    gate = asyncio.Semaphore(PARALLEL_FILES)

    async def one(item: FetchFile) -> tuple[int, str]:
        async with gate:
            return await _fetch_file(req, staging, item)

    got = await asyncio.gather(*(one(item) for item in req.files))
    return ModelFetched(
        id=req.id, received_bytes=sum(n for n, _ in got), sha256=[sha for _, sha in got]
    )


async def _fetch_file(req: ModelFetch, staging: Path, item: FetchFile) -> tuple[int, str]:
    # A thread with a blocking socket: recv_into one buffer, hash and pwrite it (OpenSSL
    # decrypts and hashlib hashes without the GIL), no asyncio copies per record
    # (measured: a third of the CPU).
    return await asyncio.to_thread(_fetch_blocking, req, staging, item)


def _fetch_blocking(req: ModelFetch, staging: Path, item: FetchFile) -> tuple[int, str]:
    """(bytes received, the whole staged file's SHA-256)."""
    where = f"{'the head' if req.tls_cert else 'the forwarding node'} at {req.host}:{req.port}"
    length = item.size - item.offset
    try:
        sock = socket.create_connection((req.host, req.port), timeout=req.timeout_s)
        context = _pinned(req.tls_cert)
        if context is not None:
            sock = context.wrap_socket(sock)
    except OSError as exc:  # ssl.SSLError and timeouts are OSErrors
        raise StoreError(SENDER_UNREACHABLE, f"cannot reach {where}: {exc}") from exc
    with sock:
        try:
            ask = {"token": req.token, "path": item.path, "offset": item.offset, "length": length}
            sock.sendall(json.dumps(ask).encode() + b"\n")
            status = read_line(sock)
            if status != b"OK\n":
                why = status.decode(errors="replace").strip() or "closed the connection"
                raise StoreError(MODEL_IO, f"{where} refused {item.path}: {why}")
            got, sha256, st = _receive(sock, staging / item.path, item.offset, length)
            if st.st_size == item.size:
                remember_arrived(staging, item.path, st, sha256)
            return got, sha256
        except ModelFileError as exc:  # the staged prefix is shorter than its offset
            raise StoreError(MODEL_IO, f"cannot resume {item.path}: {exc}") from exc
        except OSError as exc:
            if exc.errno == errno.ENOSPC:
                raise StoreError(
                    NO_SPACE, f"writing {staging / item.path} failed: the node's disk is full"
                ) from exc
            raise StoreError(
                MODEL_IO, f"fetching {item.path} from {where} failed: {exc or type(exc).__name__}"
            ) from exc


def _pinned(cert_pem: str) -> ssl.SSLContext | None:
    """TLS trusting only cert_pem (the head's certificate for this sync); None: plain TCP."""
    if not cert_pem:
        return None
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.minimum_version = ssl.TLSVersion.TLSv1_3
    context.check_hostname = False  # an address, not a name: the pinned certificate is the check
    context.load_verify_locations(cadata=cert_pem)
    return context


def _receive(
    sock: socket.socket, dest: Path, offset: int, length: int
) -> tuple[int, str, os.stat_result]:
    """length bytes from sock into dest at offset, a CHUNK per write, each hashed as it is
    written (after the staged prefix): (bytes, the file's SHA-256, its stat after the last
    write). What arrived stays (a resume)."""
    sha = sha256_prefix(dest, offset) if offset else hashlib.sha256()
    buffer = memoryview(bytearray(CHUNK))
    fd = os.open(dest, os.O_WRONLY | os.O_CREAT | (os.O_TRUNC if offset == 0 else 0), 0o644)
    got = 0
    try:
        while got < length:
            want, filled = min(CHUNK, length - got), 0
            while filled < want:
                n = sock.recv_into(buffer[filled:want])
                if not n:
                    _write(fd, buffer[:filled], offset + got)
                    raise StoreError(MODEL_IO, f"the sender closed before {dest.name} had arrived")
                filled += n
            sha.update(buffer[:filled])
            _write(fd, buffer[:filled], offset + got)
            got += filled
        return got, sha.hexdigest(), os.fstat(fd)
    finally:
        os.close(fd)


def _write(fd: int, data: memoryview, at: int) -> None:
    while data:  # a short write is rare (a full disk raises), but would leave a hole
        n = os.pwrite(fd, data, at)
        data, at = data[n:], at + n


async def handle(req: ModelServe | ModelFetch) -> ModelServing | ModelFetched:
    """The agent's entry point for the forwarding requests."""
    return await (serve(req) if isinstance(req, ModelServe) else fetch(req))
