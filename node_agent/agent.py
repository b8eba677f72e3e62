"""The agent's main loop: read requests from stdin, answer on stdout, push events.

Stop conditions, each followed by stopping every rank (SIGTERM to its group,
SIGKILL after the grace period) and exiting:
  - stdin reaches EOF (SSH channel lost, orchestrator gone),
  - stdout breaks (nobody reads us any more),
  - the lease set by `Open` expires without a request,
  - SIGTERM, SIGINT or SIGHUP,
  - the orchestrator speaks another protocol version (exit code 3).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import socket
import sys
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import msgspec

from contract import agent_protocol as protocol
from contract.agent_protocol import (
    PROTOCOL_VERSION,
    CheckPorts,
    Connect,
    ErrorReply,
    FindRdmaHolders,
    Fingerprint,
    FingerprintResult,
    Hello,
    Listen,
    ListRanks,
    Message,
    Ok,
    Open,
    Ping,
    Pong,
    PortsResult,
    RankList,
    RdmaHolders,
    Reap,
    Reaped,
    Request,
    Spawn,
    Spawned,
    Stop,
    Stopped,
    Unlisten,
    Wake,
    WatchLinks,
    WatchUsage,
)
from contract.model_manifest import (
    MODEL_IO,
    ManifestResult,
    ModelFetch,
    ModelFinalize,
    ModelManifest,
    ModelPrefixHash,
    ModelPrepare,
    ModelServe,
)
from node_agent import AGENT_VERSION, host_ops, links, model_relay, model_store, rdma_holders
from node_agent.code_digest import code_digest, code_root
from node_agent.fingerprint import collect_fingerprint
from node_agent.links import LinkProbes
from node_agent.model_hashes import ModelFileError, build_manifest
from node_agent.ranks import RankTable, SpawnError
from node_agent.stdio import LineWriter, open_protocol_stdio
from node_agent.usage import UsageReporter

log = logging.getLogger("node_agent")

EXIT_OK = 0
EXIT_PROTOCOL_MISMATCH = 3
REQUEST_LINE_LIMIT = 16 << 20


class Agent:
    def __init__(self, reader: asyncio.StreamReader, writer: LineWriter, grace_s: float) -> None:
        self._reader = reader
        self._writer = writer
        self._grace_s = grace_s
        self._root = code_root()
        self._digest: str | None = None
        self._ranks = RankTable(self.emit, self._root)
        self._links = LinkProbes(self.emit)
        self._usage = UsageReporter(self.emit, self._ranks.pids)
        self._opened = False
        self._last_request = time.monotonic()
        self._stop = asyncio.Event()
        self._stop_reason = ""
        self._exit_code = EXIT_OK
        self._tasks: set[asyncio.Task[None]] = set()

    async def emit(self, msg: Message) -> None:
        """Write one line; a broken stdout means the orchestrator is gone: shut down."""
        if self._writer.is_closing():
            return
        try:
            self._writer.write(protocol.encode(msg))
            await self._writer.drain()
        except (ConnectionError, RuntimeError) as exc:
            self.shutdown(f"stdout closed ({exc})")

    def shutdown(self, reason: str, exit_code: int = EXIT_OK) -> None:
        if not self._stop.is_set():
            self._stop_reason = reason
            self._exit_code = exit_code
            self._stop.set()

    async def run(self) -> int:
        self._digest = await asyncio.to_thread(_safe_digest, self._root)
        await self.emit(
            Hello(
                agent_version=AGENT_VERSION,
                protocol_version=PROTOCOL_VERSION,
                pid=os.getpid(),
                hostname=socket.gethostname(),
                python=sys.executable,
                code_digest=self._digest,
            )
        )
        reader = asyncio.create_task(self._read_loop())
        await self._stop.wait()
        log.info("shutting down: %s", self._stop_reason)
        reader.cancel()
        await self._links.close()
        self._usage.stop()
        self._ranks.discard_standbys()
        if len(self._ranks):
            await self._ranks.stop(None, self._grace_s)
        for task in list(self._tasks):
            task.cancel()
        self._writer.close()  # flushes what is buffered (the last exited events)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._writer.wait_closed(), 5.0)
        return self._exit_code

    async def _read_loop(self) -> None:
        while True:
            try:
                line = await self._reader.readline()
            except (ValueError, asyncio.LimitOverrunError):
                await self.emit(
                    ErrorReply(id=None, code=protocol.BAD_REQUEST, message="request line too long")
                )
                continue
            except ConnectionError:
                line = b""
            if not line:
                self.shutdown("stdin closed")
                return
            if line.strip():
                self._last_request = time.monotonic()
                await self._handle_line(line)

    async def _lease_loop(self, lease_s: float) -> None:
        """Sleeps until the lease could expire; no request within lease_s ends the agent."""
        while True:
            remaining = self._last_request + lease_s - time.monotonic()
            if remaining <= 0:
                self.shutdown(f"no request for {lease_s:g} s (lease expired)")
                return
            await asyncio.sleep(remaining)

    async def _handle_line(self, line: bytes) -> None:
        try:
            req = protocol.decode_request(line)
        except msgspec.DecodeError as exc:
            await self.emit(
                ErrorReply(
                    id=protocol.salvage_id(line),
                    code=protocol.BAD_REQUEST,
                    message=f"cannot decode request: {exc}",
                )
            )
            return
        if isinstance(req, Open):
            await self._open(req)
        elif not self._opened:
            await self._error(
                req.id, protocol.HANDSHAKE_REQUIRED, "send `open` with the protocol version first"
            )
        elif isinstance(
            req,
            Stop | Fingerprint | Reap | Connect | ModelManifest | ModelPrepare | ModelPrefixHash
            | ModelFinalize | ModelServe | ModelFetch,
        ):
            # These wait (grace periods, tools): answer out of order, keep reading.
            self._spawn_task(self._dispatch(req))
        else:
            await self._dispatch(req)

    def _spawn_task(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _open(self, req: Open) -> None:
        if req.protocol_version != PROTOCOL_VERSION:
            await self._error(
                req.id,
                protocol.PROTOCOL_MISMATCH,
                f"this agent (version {AGENT_VERSION}, at {self._root}) speaks protocol "
                f"{PROTOCOL_VERSION}, the orchestrator speaks {req.protocol_version}: "
                "deploy the orchestrator's own node_agent code to this node",
            )
            self.shutdown("protocol version mismatch", EXIT_PROTOCOL_MISMATCH)
            return
        if self._opened:
            await self._error(req.id, protocol.BAD_REQUEST, "the session is already open")
            return
        self._opened = True
        if req.lease_s:
            self._spawn_task(self._lease_loop(req.lease_s))
        await self.emit(Ok(id=req.id))

    async def _dispatch(self, req: Request) -> None:
        try:
            reply = await self._answer(req)
        except SpawnError as exc:
            await self._error(req.id, protocol.SPAWN_FAILED, str(exc))
        except model_store.StoreError as exc:
            await self._error(req.id, exc.code, exc.message)
        except ModelFileError as exc:
            await self._error(req.id, MODEL_IO, str(exc))
        except KeyError as exc:
            await self._error(req.id, protocol.UNKNOWN_RANK, f"no running rank {exc}")
        except OSError as exc:  # Listen on an address this node cannot bind
            await self._error(req.id, protocol.BIND_FAILED, f"{exc.strerror or exc}")
        except Exception as exc:
            # Not the request itself: a spawn's files hold rank 0's launch secret.
            log.exception("request %s (id %s) failed", type(req).__name__, req.id)
            await self._error(req.id, protocol.INTERNAL, f"{type(exc).__name__}: {exc}")
        else:
            await self.emit(reply)

    async def _answer(self, req: Request) -> Message:
        match req:
            case Ping():
                return Pong(id=req.id, agent_time=time.time(), ranks=len(self._ranks))
            case ListRanks():
                return RankList(id=req.id, ranks=self._ranks.infos())
            case Spawn():
                started = await self._ranks.spawn(req)
                return Spawned(id=req.id, rank=req.rank, pid=started.proc.pid)
            case Stop():
                if req.rank is not None and not self._ranks.has(req.rank):
                    raise KeyError(req.rank)
                return Stopped(id=req.id, exits=await self._ranks.stop(req.rank, req.grace_s))
            case Fingerprint():
                fp = await asyncio.to_thread(collect_fingerprint, req.model, self._digest)
                return FingerprintResult(id=req.id, fingerprint=fp)
            case CheckPorts():
                return PortsResult(id=req.id, in_use=host_ops.ports_in_use(req.host, req.ports))
            case Reap():
                killed, reason = await asyncio.to_thread(
                    host_ops.reap, req.pid, req.launch_id, req.grace_s
                )
                return Reaped(id=req.id, pid=req.pid, killed=killed, reason=reason)
            case Listen():
                await self._links.listen(req.host, req.port)
                return Ok(id=req.id)
            case Unlisten():
                await self._links.unlisten(req.host, req.port)
                return Ok(id=req.id)
            case Connect():
                return await links.connect(req.host, req.port, req.timeout_s, req.id)
            case WatchUsage():
                self._usage.watch(req.interval_s)
                return Ok(id=req.id)
            case Wake():
                self._ranks.wake_workers(req.launch_id)
                return Ok(id=req.id)
            case WatchLinks():
                await self._links.watch(
                    req.targets, req.interval_s, req.timeout_s, req.down_after
                )
                return Ok(id=req.id)
            case FindRdmaHolders():
                holders = await asyncio.to_thread(rdma_holders.find_holders)
                return RdmaHolders(id=req.id, holders=holders)
            case ModelManifest() | ModelPrepare() | ModelPrefixHash() | ModelFinalize():
                return await asyncio.to_thread(_model_request, req)
            case ModelServe() | ModelFetch():
                return await model_relay.handle(req)
        raise AssertionError(f"unhandled request {req!r}")

    async def _error(self, req_id: int | None, code: str, message: str) -> None:
        await self.emit(ErrorReply(id=req_id, code=code, message=message))


def _model_request(
    req: ModelManifest | ModelPrepare | ModelPrefixHash | ModelFinalize,
) -> Message:
    """The sync requests: blocking file work (hashing), run in a thread."""
    match req:
        case ModelManifest():
            root = model_store.model_path(req.path)
            if not root.is_dir():
                raise model_store.StoreError(MODEL_IO, f"{root} is not a directory on this node")
            manifest, stats = build_manifest(root)
            return ManifestResult(
                id=req.id, path=str(root), manifest=manifest, hashed_bytes=stats.hashed_bytes
            )
        case ModelPrepare():
            return model_store.prepare(req)
        case ModelPrefixHash():
            return model_store.prefix_hashes(req)
        case ModelFinalize():
            return model_store.finalize(req)


def _safe_digest(root: Path) -> str | None:
    try:
        return code_digest(root)
    except OSError:
        return None


async def _amain(grace_s: float) -> int:
    reader, writer = await open_protocol_stdio(REQUEST_LINE_LIMIT)
    agent = Agent(reader, writer, grace_s)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        loop.add_signal_handler(sig, agent.shutdown, f"received {sig.name}")
    return await agent.run()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m node_agent",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--grace",
        type=float,
        default=5.0,
        help="seconds between SIGTERM and SIGKILL when the agent shuts down",
    )
    parser.add_argument(
        "--version",
        action="version",
        version=f"node_agent {AGENT_VERSION} (protocol {PROTOCOL_VERSION})",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(
        stream=sys.stderr,
        level=logging.INFO,
        format=f"node_agent[{os.getpid()}] %(levelname)s %(message)s",
    )
    return asyncio.run(_amain(args.grace))
