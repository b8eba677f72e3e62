"""The state file `up` keeps, so `status` and `down` work from another shell.

It records the orchestrator's PID and address and every rank's node, PID and launch id, so a
new `up` can end what a crashed run left behind (checking the launch id, never a stranger).
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path

import msgspec
import psutil
import tomli_w

from orchestrator.config import ClusterSpec


class RankRecord(msgspec.Struct, kw_only=True):
    rank: int
    node: str
    pid: int
    launch_id: str


class ClusterState(msgspec.Struct, kw_only=True):
    cluster: str
    config: str
    orchestrator_pid: int
    orchestrator_started: float  # psutil create_time, so a reused PID is not mistaken for ours
    api_url: str
    api_key_env: str = ""  # the variable's name, so `status` can authenticate; never the key
    launch_id: str = ""
    ranks: list[RankRecord] = msgspec.field(default_factory=list)


def state_path(spec: ClusterSpec) -> Path:
    return spec.state_dir / f"{spec.cluster.name}.toml"


def write_state(path: Path, state: ClusterState) -> None:
    """Atomically: a reader never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temp = path.with_suffix(f".tmp{os.getpid()}")
    # A fresh file of our own, never through a link someone left at the temp name.
    temp.unlink(missing_ok=True)  # unlink removes a link itself, never its target
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        out.write(tomli_w.dumps(msgspec.to_builtins(state)))
    temp.replace(path)


def read_state(path: Path) -> ClusterState | None:
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, tomllib.TOMLDecodeError):
        return None
    try:
        return msgspec.convert(data, ClusterState)
    except msgspec.ValidationError:
        return None


def remove_state(path: Path) -> None:
    path.unlink(missing_ok=True)


def orchestrator_alive(state: ClusterState) -> bool:
    """True when the recorded orchestrator still runs (same PID and same start time)."""
    try:
        process = psutil.Process(state.orchestrator_pid)
        same = abs(process.create_time() - state.orchestrator_started) < 1.0
        # An exited orchestrator whose parent has not reaped it yet is a zombie: gone.
        return same and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def own_start_time() -> float:
    return psutil.Process().create_time()
