"""The cluster's thinking key on the head (contract/thinking_key.py): drawn once, kept
0600 in the state dir, put into every launch's rank 0 files so that every rank 0 of the
cluster, across restarts, signs and checks thinking blocks with the same key."""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from contract import thinking_key
from contract.private_file import write_private
from orchestrator.launch.plan import LaunchPlan


def key_path(state_dir: Path, cluster: str) -> Path:
    return state_dir / f"{cluster}.thinking-key"


def ensure(state_dir: Path, cluster: str) -> str:
    """The kept key; drawn (256 bits) and written owner-only on first use."""
    path = key_path(state_dir, cluster)
    kept = _read_kept(path)
    if kept:
        return kept
    state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    key = secrets.token_urlsafe(32)
    write_private(path, key.encode())
    return key


def _read_kept(path: Path) -> str:
    """The kept key, read from a regular file only: a link at its name is no key of ours
    (it would make a file someone else chose the signing key)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return ""  # missing, or a link (ELOOP): a new key replaces it
    with os.fdopen(fd, encoding="utf-8") as handle:
        return handle.read().strip()


def give_to_rank0(plan: LaunchPlan, key: str) -> None:
    """Rank 0's files carry the key (only rank 0 answers the API)."""
    for rank in plan.ranks:
        if rank.rank == 0:
            rank.files = {**rank.files, thinking_key.FILE: key}
