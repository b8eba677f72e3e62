"""Why a gang failed: each rank failure classified into one cause, and the root cause picked.

Failures come back as values (as in torch elastic's ProcessFailure), with the exit code or
signal name and the last stderr lines, so the operator sees why without opening logs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from enum import StrEnum

from contract.agent_protocol import Exited
from contract.exit_codes import RankExit, describe_exit
from orchestrator.launch.gang import SpawnFailure


class Cause(StrEnum):
    RANK_CRASHED = "rank_crashed"
    PEER_LOST = "peer_lost"
    DESYNC = "desync"
    EBUSY = "ebusy"
    OOM = "oom"
    INIT_TIMEOUT = "init_timeout"
    HANG = "hang"
    AGENT_LOST = "agent_lost"
    LINK_DOWN = "link_down"  # a link between ranks stopped answering the agents' probes
    SPAWN_FAILED = "spawn_failed"  # the node refused to start a rank: a restart cannot help


# JACCL reports ibv_* failures with errno 16 when the RDMA resources of a previous job are
# still held; "Device or resource busy" is strerror(EBUSY).
_EBUSY = re.compile(r"\bEBUSY\b|errno 16\b|Device or resource busy", re.IGNORECASE)
_OOM = re.compile(
    r"\[metal::malloc\]|Resource limit .* exceeded|std::bad_alloc|MemoryError|"
    r"out of memory|Unable to allocate",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class RankFailure:
    cause: Cause
    node: str
    rank: int | None
    detail: str
    at: float  # monotonic time the orchestrator learnt of it
    exit_code: int | None = None
    signal: str | None = None
    stderr_tail: tuple[str, ...] = field(default=())

    def summary(self) -> str:
        where = f"rank {self.rank} on {self.node}" if self.rank is not None else self.node
        return f"{self.cause}: {where}: {self.detail}"


def classify_spawn(failure: SpawnFailure, at: float) -> RankFailure:
    """A rank that could not start: permanent (the node refused it) or the node unreachable."""
    cause = Cause.SPAWN_FAILED if failure.permanent else Cause.AGENT_LOST
    return RankFailure(cause, failure.node, failure.rank,
                       f"cannot start the rank: {failure.message}", at)


def classify_exit(
    exited: Exited, node: str, at: float, *, memory_pressure: bool = False
) -> RankFailure:
    """The cause of one rank's unrequested exit, from its code, signal and last stderr lines."""
    tail = tuple(exited.stderr_tail)
    text = "\n".join(tail)
    code, sig = exited.returncode, exited.signal
    detail = sig or (describe_exit(code) if code is not None else "exited")
    if _EBUSY.search(text):
        cause = Cause.EBUSY
    elif code == RankExit.DESYNC:
        cause = Cause.DESYNC
    elif code == RankExit.OUT_OF_MEMORY or _OOM.search(text) or (
        sig == "SIGKILL" and memory_pressure
    ):
        cause = Cause.OOM
    elif code == RankExit.PEER_LOST:
        cause = Cause.PEER_LOST
    else:
        cause = Cause.RANK_CRASHED
    return RankFailure(cause, node, exited.rank, detail, at, code, sig, tail)


def root_cause(failures: list[RankFailure]) -> RankFailure:
    """The earliest failure that is not a consequence of another.

    When one rank dies its peers exit with peer_lost shortly after; which report reaches us
    first depends on the network, so a peer_lost is the root only when nothing else failed.
    """
    if not failures:
        raise ValueError("no failures")
    primary = [failure for failure in failures if failure.cause != Cause.PEER_LOST]
    return min(primary or failures, key=lambda failure: failure.at)


@dataclass(frozen=True)
class GangResult:
    """How one gang ended: every rank failure reported while it stopped, and the root."""

    failures: tuple[RankFailure, ...]
    root: RankFailure

    @classmethod
    def of(cls, failures: list[RankFailure]) -> GangResult:
        return cls(tuple(failures), root_cause(failures))


@dataclass(frozen=True)
class RunResult:
    """What `Supervisor.run()` returns once the run is over (stop request or shutdown)."""

    restarts: int
    last: GangResult | None  # the latest gang failure, if any
