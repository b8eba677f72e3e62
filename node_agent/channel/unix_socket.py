"""The agent's Unix socket: where a new orchestrator finds an agent that outlived the last.

    <state_dir>/agents/            0700, ours
    <state_dir>/agents/<cluster>.<node>.sock     0600, ours, one agent listens

Both ends check before they trust it: a directory or socket of another user, or one that
others may write to, is refused (never connected to, never removed). A socket nobody
listens on is a dead agent's: removed, so that a fresh agent can take its place.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import stat
from collections.abc import Awaitable, Callable
from pathlib import Path

DIR_MODE = 0o700
SOCKET_MODE = 0o600
# sun_path holds 104 bytes on macOS (108 on Linux), with its terminating NUL.
MAX_PATH_BYTES = 103

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


class SocketRefused(Exception):
    """The socket or its directory cannot be trusted (or used): say why and what to do."""


def socket_path(state_dir: str, cluster: str, node: str) -> str:
    """The socket's path as the node expands it ("~" is the node's home)."""
    return f"{state_dir.rstrip('/')}/agents/{cluster}.{node}.sock"


def check_owned(path: Path, uid: int | None = None) -> None:
    """Refuse a socket (or its directory) that is not this user's alone."""
    uid = os.getuid() if uid is None else uid
    for target, kind in ((path.parent, "directory"), (path, "socket")):
        try:
            info = target.lstat()
        except FileNotFoundError:
            continue
        if info.st_uid != uid:
            raise SocketRefused(
                f"the agent {kind} {target} belongs to uid {info.st_uid}, not to this user "
                f"(uid {uid}): refusing to use it; remove it or set another [cluster] state_dir"
            )
        if kind == "socket" and not stat.S_ISSOCK(info.st_mode):
            raise SocketRefused(f"{target} is not a socket: remove it")
        if kind == "directory" and info.st_mode & 0o077:
            raise SocketRefused(
                f"the agent directory {target} is open to other users "
                f"(mode {stat.S_IMODE(info.st_mode):o}): `chmod 700 {target}`"
            )


def checked_path(path_text: str) -> Path:
    path = Path(os.path.expanduser(path_text))
    if len(os.fsencode(path)) > MAX_PATH_BYTES:
        raise SocketRefused(
            f"the agent socket path {path} is longer than {MAX_PATH_BYTES} bytes: "
            "set a shorter [cluster] state_dir"
        )
    check_owned(path)
    return path


def _listening(path: Path) -> bool:
    """True when an agent accepts on path; a refused connect means a dead agent's file."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(str(path))
    except (ConnectionRefusedError, FileNotFoundError):
        return False
    finally:
        probe.close()
    return True


def remove_if_stale(path: Path) -> bool:
    """Remove a socket nobody listens on; True when it was stale (and is gone now)."""
    if not path.exists() or _listening(path):
        return False
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    return True


async def serve(path_text: str, on_client: Handler) -> tuple[asyncio.Server, Path]:
    """Listen on the node's socket; SocketRefused when another live agent has it."""
    path = checked_path(path_text)
    path.parent.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
    check_owned(path)
    if path.exists() and not remove_if_stale(path):
        raise SocketRefused(f"another agent already listens on {path}")
    old_umask = os.umask(0o177)  # the socket is born 0600: no window where others connect
    try:
        server = await asyncio.start_unix_server(on_client, str(path), limit=16 << 20)
    finally:
        os.umask(old_umask)
    os.chmod(path, SOCKET_MODE)
    return server, path


async def connect(
    path_text: str, limit: int = 64 << 20
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
    """A connection to the agent on path; None when there is none (a stale socket is
    removed). SocketRefused for a socket that is not ours."""
    path = checked_path(path_text)
    if not path.exists():
        return None
    try:
        return await asyncio.open_unix_connection(str(path), limit=limit)
    except (ConnectionRefusedError, FileNotFoundError):
        remove_if_stale(path)
        return None
