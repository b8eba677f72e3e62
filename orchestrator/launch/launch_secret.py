"""Each launch's secret on the head: drawn for the plan, kept 0600 in the state dir.

The plan puts it into rank 0's files (contract/launch_secret.py); the gateway sends it on
every request to rank 0. Kept on disk with its launch id, so that whoever needs to reach
that launch's rank 0 later (an orchestrator adopting the running gang, a test or bench
calling rank 0 directly) can `load` it; a new launch overwrites it with its own.
"""

from __future__ import annotations

import secrets
from pathlib import Path

import msgspec

from contract.private_file import write_private


class SecretFileError(Exception):
    """The kept secret cannot be trusted or read."""


class LaunchSecret(msgspec.Struct, kw_only=True):
    launch_id: str
    secret: str
    tls_cert: str = ""  # rank 0's certificate when it serves TLS: pinned after adoption too


def new_secret() -> str:
    return secrets.token_urlsafe(32)  # 256 bits


def secret_path(state_dir: Path, cluster: str) -> Path:
    return state_dir / f"{cluster}.launch-secret.json"


def save(state_dir: Path, cluster: str, record: LaunchSecret) -> None:
    """Atomically, owner-only from the first byte, never through a link (contract/private_file)."""
    state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = secret_path(state_dir, cluster)
    write_private(path, msgspec.json.encode(record))


def load(state_dir: Path, cluster: str, launch_id: str | None = None) -> LaunchSecret | None:
    """The latest launch's secret; None if none is kept or it is another launch's than
    `launch_id`. SecretFileError if others may read the file, or it is not ours."""
    path = secret_path(state_dir, cluster)
    try:
        mode = path.stat().st_mode
        if mode & 0o077:
            raise SecretFileError(
                f"{path} is readable by others (mode {mode & 0o777:o}): its secret may be "
                f"known; end the gang (`orchestrator down`) and `up` again for a new one"
            )
        record = msgspec.json.decode(path.read_bytes(), type=LaunchSecret)
    except FileNotFoundError:
        return None
    except (OSError, msgspec.DecodeError) as exc:
        raise SecretFileError(f"cannot read {path}: {exc}") from exc
    if launch_id is not None and record.launch_id != launch_id:
        return None
    return record


def remove(state_dir: Path, cluster: str) -> None:
    secret_path(state_dir, cluster).unlink(missing_ok=True)
