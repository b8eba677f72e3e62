"""One-off operations on the node for the orchestrator: free-port checks and reaping leftovers."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import time
from pathlib import Path

from contract.private_file import write_private
from contract.rank_env import LAUNCH_ID


def ports_in_use(host: str, ports: list[int]) -> list[int]:
    """The ports a listener could not bind on host right now."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    busy = []
    for port in ports:
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            # As servers do: connections of an earlier run in TIME_WAIT do not block a listener.
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind((host, port))
            except OSError:
                busy.append(port)
    return busy


def write_files(directory: Path, files: dict[str, str]) -> None:
    """Write a rank's files into its directory, refusing names that would leave it."""
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    for name, text in files.items():
        if not name or name != os.path.basename(name) or name in (".", ".."):
            raise ValueError(f"file name {name!r} must be a plain name")
        write_private(directory / name, text.encode())  # never through a link at that name


def reap(pid: int, launch_id: str, grace_s: float) -> tuple[bool, str]:
    """End pid's process group if, and only if, the process carries launch_id in its env."""
    found = _launch_id_of(pid)
    if found is None:
        return False, "not running or not readable"
    if found != launch_id:
        return False, f"launch id differs ({found or 'none'}): not ours"
    _signal_group(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while _exists(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    if _exists(pid):
        _signal_group(pid, signal.SIGKILL)
    return True, "ended"


def _launch_id_of(pid: int) -> str | None:
    """The MLX_LAUNCH_ID in pid's environment ("" if unset); None if it is gone or unreadable."""
    try:
        import psutil

        return str(psutil.Process(pid).environ().get(LAUNCH_ID, ""))
    except ImportError:
        pass
    except Exception:
        return None
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return None
    for entry in raw.split(b"\0"):
        key, _, value = entry.partition(b"=")
        if key.decode(errors="replace") == LAUNCH_ID:
            return value.decode(errors="replace")
    return ""


def _exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie awaiting its parent is gone for our purposes
        import psutil

        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except Exception:
        return True


def _signal_group(pid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(os.getpgid(pid), sig)
    except (ProcessLookupError, PermissionError):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
