"""Exit codes of the rank program (`python -m serving`).

The orchestrator imports this module to classify a rank's exit. The codes stay
clear of 1 (generic Python error), 2 (argparse usage) and 128+n (killed by a
signal, as shells report it).
"""

from __future__ import annotations

from enum import IntEnum


class RankExit(IntEnum):
    """Distinct exit codes of a serving rank, one meaning each."""

    OK = 0  # clean stop: SIGTERM on rank 0, or a shutdown plan received by a worker
    CONFIG_ERROR = 10  # settings file or CLI flags invalid, or the distributed env incomplete
    MODEL_LOAD_FAILED = 11  # the model could not be resolved, loaded or sharded
    DISTRIBUTED_INIT_FAILED = 12  # mx.distributed.init failed (ring connect, JACCL/RDMA setup)
    PEER_LOST = 13  # a collective failed because another rank went away
    DESYNC = 14  # a worker's batch fingerprint, step id or token digest differed from rank 0's
    INJECTED_FAULT = 15  # an ORCHESTRATOR_FAULT "exit" without an explicit code
    INTERNAL_ERROR = 16  # an unexpected exception in the engine or the worker loop
    API_BIND_FAILED = 17  # rank 0 could not bind its HTTP API address
    OUT_OF_MEMORY = 18  # an MLX allocation failed (past [serving] memory_limit_gb, or RAM)

    @property
    def meaning(self) -> str:
        return _MEANINGS[self]


_MEANINGS: dict[RankExit, str] = {
    RankExit.OK: "clean stop",
    RankExit.CONFIG_ERROR: "invalid settings or distributed environment",
    RankExit.MODEL_LOAD_FAILED: "model could not be loaded or sharded",
    RankExit.DISTRIBUTED_INIT_FAILED: "distributed backend initialisation failed",
    RankExit.PEER_LOST: "connection to a peer rank was lost",
    RankExit.DESYNC: "batch desynchronised between ranks",
    RankExit.INJECTED_FAULT: "fault injected for testing",
    RankExit.INTERNAL_ERROR: "unexpected internal error",
    RankExit.API_BIND_FAILED: "rank 0 could not bind its API address",
    RankExit.OUT_OF_MEMORY: "an MLX allocation failed: out of memory",
}


def describe_exit(code: int) -> str:
    """A short human description of a rank's exit code (negative = signal)."""
    if code < 0:
        return f"killed by signal {-code}"
    try:
        rank_exit = RankExit(code)
    except ValueError:
        return f"exit code {code}"
    return f"{rank_exit.name.lower()} ({rank_exit.meaning})"
