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
