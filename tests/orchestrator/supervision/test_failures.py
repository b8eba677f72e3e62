"""Failure classification from exit codes, signals and stderr lines; root-cause choice."""

from __future__ import annotations

import pytest

from contract.agent_protocol import Exited
from contract.exit_codes import RankExit
from orchestrator.supervision.failures import Cause, classify_exit, root_cause
from serving.faults import EBUSY_LINE


def exited(returncode: int | None = None, signal: str | None = None, *tail: str) -> Exited:
    return Exited(rank=1, pid=4242, returncode=returncode, signal=signal, stderr_tail=list(tail))


@pytest.mark.parametrize(
    ("event", "cause", "detail"),
    [
        (exited(None, "SIGKILL"), Cause.RANK_CRASHED, "SIGKILL"),
        (exited(1, None, "Traceback ...", "ValueError: boom"), Cause.RANK_CRASHED, "exit code 1"),
        (exited(RankExit.PEER_LOST), Cause.PEER_LOST, "peer_lost"),
        (exited(RankExit.DESYNC), Cause.DESYNC, "desync"),
        # The exit code is the contract: a log line alone does not make a desync.
        (
            exited(RankExit.INTERNAL_ERROR, None, "BATCH DESYNC step 5: a != b"),
            Cause.RANK_CRASHED,
            "",
        ),
        (exited(RankExit.DISTRIBUTED_INIT_FAILED, None, EBUSY_LINE), Cause.EBUSY, ""),
        (
            exited(
                1, None, "libc++abi: terminating: [metal::malloc] Resource limit (499000) exceeded"
            ),
            Cause.OOM,
            "",
        ),
        # MLX's allocator's own words (mlx/backend/metal/allocator.cpp), as the rank logs
        # them before exiting OUT_OF_MEMORY (serving/memory_limit.py).
        (
            exited(RankExit.OUT_OF_MEMORY, None, "ERROR serving.rank: out of memory: "
                   "[malloc] Unable to allocate 1073741824 bytes."),
            Cause.OOM,
            "out_of_memory",
        ),
        # The exit code alone, when the log line fell out of the tail.
        (exited(RankExit.OUT_OF_MEMORY), Cause.OOM, "out_of_memory"),
    ],
)
def test_classify_exit(event: Exited, cause: Cause, detail: str) -> None:
    """Each exit maps to its cause, keeping code, signal and stderr for the operator."""
    failure = classify_exit(event, "b", at=1.0)
    assert failure.cause == cause
    assert detail in failure.detail
    assert failure.stderr_tail == tuple(event.stderr_tail)
    assert failure.summary().startswith(f"{cause}: rank 1 on b")


def test_sigkill_under_memory_pressure_is_oom() -> None:
    """A SIGKILL while the node is short of memory is the kernel's OOM killer."""
    assert classify_exit(exited(None, "SIGKILL"), "b", 1.0, memory_pressure=True).cause == Cause.OOM


def test_root_cause_prefers_the_crash_over_its_peer_lost_echo() -> None:
    """Rank 0's peer_lost that arrives first is a consequence of the worker's crash."""
    echo = classify_exit(exited(RankExit.PEER_LOST), "a", at=1.0)
    crash = classify_exit(exited(None, "SIGKILL"), "b", at=1.2)
    assert root_cause([echo, crash]) is crash
    assert root_cause([echo]) is echo


def test_root_cause_is_the_earliest() -> None:
    """Among primary failures the earliest is the root."""
    later = classify_exit(exited(RankExit.DESYNC), "a", at=2.0)
    first = classify_exit(exited(None, "SIGSEGV"), "b", at=1.0)
    assert root_cause([later, first]) is first


# MLX's own JACCL lines (mlx/distributed/jaccl/utils.cpp: `"[jaccl] Changing queue pair to
# <state> failed with errno " << status`, a std::invalid_argument, which Python sees as
# ValueError and an uncaught C++ throw as libc++abi's terminating line): errno 16 only, no
# strerror text.
UPSTREAM_EBUSY = [
    "ValueError: [jaccl] Changing queue pair to INIT failed with errno 16",
    "ValueError: [jaccl] Changing queue pair to RTR failed with errno 16",
    "libc++abi: terminating due to uncaught exception of type std::invalid_argument: "
    "[jaccl] Changing queue pair to RTS failed with errno 16",
]


@pytest.mark.parametrize(
    "line",
    [
        *UPSTREAM_EBUSY,
        "ibv_open_device: Device or resource busy",  # strerror(EBUSY) alone
        "rdma_en3: ibv_create_qp returned EBUSY",  # the errno's name alone
    ],
)
def test_each_ebusy_spelling_alone_is_ebusy(line: str) -> None:
    """Each alternative of the pattern on its own, MLX's exact lines among them."""
    failure = classify_exit(exited(RankExit.DISTRIBUTED_INIT_FAILED, None, line), "b", at=1.0)
    assert failure.cause == Cause.EBUSY


@pytest.mark.parametrize(
    "line",
    [
        "ValueError: [jaccl] Changing queue pair to INIT failed with errno 160",
        "ValueError: [jaccl] Changing queue pair to RTR failed with errno 1",
        "[jaccl] Couldn't create queue pair",
    ],
)
def test_other_errnos_are_not_ebusy(line: str) -> None:
    """errno 160 or 1 is not 16: a crash, restarted as one, not EBUSY's holder hunt."""
    failure = classify_exit(exited(RankExit.DISTRIBUTED_INIT_FAILED, None, line), "b", at=1.0)
    assert failure.cause == Cause.RANK_CRASHED
