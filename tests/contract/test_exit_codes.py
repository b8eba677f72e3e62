"""contract/exit_codes.py: what a rank's exit code means."""

from __future__ import annotations

from contract.exit_codes import RankExit, describe_exit


def test_exit_codes_are_distinct_and_clear_of_shell_codes() -> None:
    """Every RankExit is unique, has a meaning, and avoids 1, 2 and 128+n."""
    codes = [int(c) for c in RankExit]
    assert len(codes) == len(set(codes))
    assert all(c not in (1, 2) and c < 128 for c in codes)
    assert all(c.meaning for c in RankExit)
    assert describe_exit(RankExit.PEER_LOST).startswith("peer_lost")
    assert describe_exit(-9) == "killed by signal 9"


def test_describe_exit_of_known_unknown_and_signalled_codes() -> None:
    """Our codes by name and meaning, others by number, signals by signal."""
    assert describe_exit(0) == "ok (clean stop)"
    assert describe_exit(RankExit.DESYNC) == "desync (batch desynchronised between ranks)"
    assert describe_exit(99) == "exit code 99"
    assert describe_exit(1) == "exit code 1"
    assert describe_exit(-15) == "killed by signal 15"
