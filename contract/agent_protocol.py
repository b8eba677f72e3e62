"""The agent protocol: typed messages, one JSON object per line.

    orchestrator ──Request (id)──────▶ agent   Open, Fingerprint, Spawn, Stop, Ping, ListRanks,
                                                 CheckPorts, Reap, Listen, Unlisten, Connect,
                                                 WatchLinks, WatchUsage, Wake, FindRdmaHolders,
                                                 Adopt (contract/adoption.py)
    orchestrator ◀──Reply (same id)─── agent   Ok, ErrorReply, FingerprintResult, Spawned,
                                                 Stopped, Pong, RankList, PortsResult, Reaped,
                                                 Reachable, RdmaHolders
    orchestrator ◀──Event (no id)───── agent   Hello (first line), Log, Exited, LinkState,
                                                 NodeUsage

The model-sync messages live in contract/model_manifest.py, members of the unions below.
Every message carries its kind in the `type` field (a msgspec tagged union). The agent
writes `Hello` on each new connection; the orchestrator's first request must be `Open`
with its PROTOCOL_VERSION, which the agent refuses when it differs from its own, and then
ends its ranks and exits. Hello's and Open's fields present in version 6 never change
meaning: an orchestrator of any version can tell a left-over agent to go.
"""

from __future__ import annotations

from typing import Literal

import msgspec
from msgspec import Struct

from contract.adoption import Adopt, LaunchRecord
from contract.fingerprint import MemoryInfo, NodeFingerprint
from contract.message import Message
from contract.model_manifest import (
    ManifestResult,
    ModelFinalize,
    ModelFinalized,
    ModelManifest,
    ModelPrefixHash,
    ModelPrepare,
    ModelPrepared,
    PrefixHashes,
    RelayReply,
    RelayRequest,
)

PROTOCOL_VERSION = 7

# Error codes of ErrorReply.
PROTOCOL_MISMATCH = "protocol_mismatch"
HANDSHAKE_REQUIRED = "handshake_required"
BAD_REQUEST = "bad_request"
RANK_EXISTS = "rank_exists"
SPAWN_FAILED = "spawn_failed"
UNKNOWN_RANK = "unknown_rank"
BIND_FAILED = "bind_failed"
INTERNAL = "internal"


# ── requests (orchestrator → agent) ──────────────────────────────────────────


class Open(Message, tag="open", kw_only=True):
    """Handshake. lease_s: when set, no request for that long ends the session (the
    handle pings every lease_s / 3). A session that ends (this, EOF, a broken write)
    stops the ranks and the agent, unless orphan_grace_s > 0: then the ranks serve on
    that long, waiting for an orchestrator to adopt them (node_agent/orphan.py).
    orchestrator_id: the same orchestrator reconnecting takes over its old session, which
    may not have seen its end yet; another is refused while that session holds its lease."""

    id: int = 0
    protocol_version: int
    lease_s: float | None = None
    orphan_grace_s: float = 0.0
    orchestrator_id: str = ""


class Fingerprint(Message, tag="fingerprint", kw_only=True):
    id: int = 0
    model: str | None = None  # the model spec to inspect ("bundled:..." or a path)


class Spawn(Message, tag="spawn", kw_only=True):
    """Start one rank process in its own session (process group)."""

    id: int = 0
    rank: int
    argv: list[str]
    env: dict[str, str] = msgspec.field(default_factory=dict)
    inherit_env: bool = True  # start from the agent's environment, then apply env
    cwd: str | None = None
    log_file: str | None = None  # both streams are appended here, raw
    # Plain file name -> text, written (mode 0600) into cwd, which is created if missing:
    # the rank's settings and hostfile travel with the request, no extra copy step.
    files: dict[str, str] = msgspec.field(default_factory=dict)
    # Start the process now but hold it (rank_env.STANDBY=1) until rank_env.STANDBY_GO on
    # stdin: a later Spawn equal in every field but id and standby runs that very process
    # (same pid), so a relaunch skips interpreter start and imports.
    standby: bool = False
    launch: LaunchRecord | None = None  # kept while the gang runs, for an adopter


class Stop(Message, tag="stop", kw_only=True):
    """SIGTERM to the rank's process group, SIGKILL after grace_s; replies once gone."""

    id: int = 0
    rank: int | None = None  # None: every rank
    grace_s: float = 10.0


class Ping(Message, tag="ping", kw_only=True):
    id: int = 0


class ListRanks(Message, tag="list", kw_only=True):
    id: int = 0


class CheckPorts(Message, tag="check_ports", kw_only=True):
    """Which of these TCP ports cannot be bound on host (preflight: ports in use)."""

    id: int = 0
    host: str
    ports: list[int]


class Reap(Message, tag="reap", kw_only=True):
    """End a process a previous run left behind, only if its env carries launch_id."""

    id: int = 0
    pid: int
    launch_id: str
    grace_s: float = 5.0


class Listen(Message, tag="listen", kw_only=True):
    """Accept (and at once close) TCP connections on host:port until Unlisten: the far end
    of a reachability check before launch, on the address and port a rank will use."""

    id: int = 0
    host: str
    port: int


class Unlisten(Message, tag="unlisten", kw_only=True):
    id: int = 0
    host: str
    port: int


class Connect(Message, tag="connect", kw_only=True):
    """Open a TCP connection from this node to host:port (answered with Reachable)."""

    id: int = 0
    host: str
    port: int
    timeout_s: float = 3.0


class LinkTarget(Struct, frozen=True, kw_only=True):
    host: str
    port: int


class WatchLinks(Message, tag="watch_links", kw_only=True):
    """Probe each target every interval_s while the gang runs (a TCP connect: an accept or
    a refusal both prove the link carries packets); push LinkState when one changes. A
    target is down after down_after probes in a row got no answer within timeout_s (they
    overlap; past the SYN's retransmission at 1 s). Replaces the previous watch; [] stops."""

    id: int = 0
    targets: list[LinkTarget] = msgspec.field(default_factory=list)
    interval_s: float = 1.0
    timeout_s: float = 1.5
    down_after: int = 2


class WatchUsage(Message, tag="watch_usage", kw_only=True):
    """Push a NodeUsage event every interval_s from now on (0: stop)."""

    id: int = 0
    interval_s: float


class Wake(Message, tag="wake", kw_only=True):
    """A request is on its way to rank 0: SIGUSR2 to this node's worker ranks (rank >= 1)
    of launch_id, which ends their idle sleep between keepalives at once."""

    id: int = 0
    launch_id: str


class FindRdmaHolders(Message, tag="rdma_holders", kw_only=True):
    """After a JACCL EBUSY: which processes hold (or, running JACCL, may hold) this node's
    RDMA devices (answered with RdmaHolders)."""

    id: int = 0


Request = (
    Open
    | Fingerprint
    | Spawn
    | Stop
    | Ping
    | ListRanks
    | CheckPorts
    | Reap
    | Listen
    | Unlisten
    | Connect
    | WatchLinks
    | WatchUsage
    | Wake
    | FindRdmaHolders
    | Adopt
    | ModelManifest | ModelPrepare | ModelPrefixHash | ModelFinalize
    | RelayRequest  # forwarding along the ring (contract/model_manifest.py)
)


# ── replies (agent → orchestrator, same id) ──────────────────────────────────


class Ok(Message, tag="ok", kw_only=True):
    id: int


class ErrorReply(Message, tag="error", kw_only=True):
    id: int | None  # None when the request could not even be parsed
    code: str
    message: str


class FingerprintResult(Message, tag="fingerprint_result", kw_only=True):
    id: int
    fingerprint: NodeFingerprint


class Spawned(Message, tag="spawned", kw_only=True):
    id: int
    rank: int
    pid: int


class Pong(Message, tag="pong", kw_only=True):
    id: int
    agent_time: float
    ranks: int


class RankInfo(Struct, kw_only=True):
    rank: int
    pid: int
    launch_id: str | None = None
    argv: list[str] = msgspec.field(default_factory=list)
    started_at: float  # time.time() on the node


class RankList(Message, tag="ranks", kw_only=True):
    id: int
    ranks: list[RankInfo] = msgspec.field(default_factory=list)
    launch: LaunchRecord | None = None  # the running gang's, as its Spawn requests carried it
    orphaned_since: float | None = None  # time.time() its last orchestrator went away


class PortsResult(Message, tag="ports", kw_only=True):
    id: int
    in_use: list[int] = msgspec.field(default_factory=list)


class Reachable(Message, tag="reachable", kw_only=True):
    id: int
    ok: bool
    refused: bool = False  # the host answered, but nothing listens on that port
    error: str = ""  # why not: "no answer within 3 s", "connection refused", ...
    seconds: float = 0.0  # how long the connect took


class Reaped(Message, tag="reaped", kw_only=True):
    id: int
    pid: int
    killed: bool  # True: it was ours and has been ended
    reason: str  # why not, when killed is False ("not running", "launch id differs")


class RdmaHolder(Struct, frozen=True, kw_only=True):
    pid: int
    command: str  # its command line, cut to 200 characters
    files: list[str] = msgspec.field(default_factory=list)  # RDMA device files it has open
    jaccl_env: bool = False  # its env carries MLX_IBV_DEVICES or MLX_JACCL_COORDINATOR
    launch_id: str = ""  # the MLX_LAUNCH_ID in its env: ours when it is one of our launches


class RdmaHolders(Message, tag="rdma_holders_result", kw_only=True):
    id: int
    holders: list[RdmaHolder] = msgspec.field(default_factory=list)


# ── events (agent → orchestrator, pushed) ────────────────────────────────────


class Hello(Message, tag="hello", kw_only=True):
    agent_version: str
    protocol_version: int
    pid: int
    hostname: str
    python: str
    code_digest: str | None = None


class Log(Message, tag="log", kw_only=True):
    rank: int
    stream: Literal["stdout", "stderr"]
    line: str


class Exited(Message, tag="exited", kw_only=True):
    rank: int
    pid: int
    launch_id: str | None = None
    returncode: int | None = None  # exit status when it exited by itself
    signal: str | None = None  # "SIGKILL" when a signal ended it
    stopped: bool = False  # True when a Stop request (or agent shutdown) ended it
    stderr_tail: list[str] = msgspec.field(default_factory=list)


class Stopped(Message, tag="stopped", kw_only=True):
    id: int
    exits: list[Exited] = msgspec.field(default_factory=list)


class LinkState(Message, tag="link_state", kw_only=True):
    """A watched link changed: down after down_after silent probes, up at the next answer."""

    host: str
    port: int
    up: bool
    error: str = ""


class RankUsage(Struct, kw_only=True):
    rank: int
    pid: int
    rss_bytes: int  # the rank and everything in its process group's tree


class NodeUsage(Message, tag="usage", kw_only=True):
    """What the node has and what our ranks take, now (live telemetry)."""

    memory: MemoryInfo
    load_1m: float | None = None  # the 1-minute load average
    cpu_count: int | None = None
    ranks: list[RankUsage] = msgspec.field(default_factory=list)
    wired_bytes: int | None = None  # macOS: memory wired down (Metal buffers count here)
    gpu_wired_limit_mb: int | None = None  # macOS iogpu.wired_limit_mb; 0 = system default


Reply = (
    Ok
    | ErrorReply
    | FingerprintResult
    | Spawned
    | Stopped
    | Pong
    | RankList
    | PortsResult
    | Reaped
    | Reachable
    | RdmaHolders
    | ManifestResult | ModelPrepared | PrefixHashes | ModelFinalized | RelayReply
)
Event = Hello | Log | Exited | LinkState | NodeUsage
AgentMessage = Reply | Event


class _IdOnly(Struct):  # salvages the id of a request that failed to decode
    id: int | None = None


_encoder = msgspec.json.Encoder()
_request_decoder = msgspec.json.Decoder(Request)
_agent_decoder = msgspec.json.Decoder(AgentMessage)


def encode(msg: Message) -> bytes:
    """One wire line: JSON without newlines (JSON escapes them) plus b"\\n"."""
    return _encoder.encode(msg) + b"\n"


def decode_request(line: bytes) -> Request:
    return _request_decoder.decode(line)


def decode_agent_message(line: bytes) -> AgentMessage:
    return _agent_decoder.decode(line)


def salvage_id(line: bytes) -> int | None:
    try:
        return msgspec.json.decode(line, type=_IdOnly).id
    except msgspec.DecodeError:
        return None
