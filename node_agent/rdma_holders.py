"""Who holds this node's RDMA devices, asked after a JACCL EBUSY.

A Thunderbolt RDMA device has about ten queue pairs and a hundred memory regions
(ml-explore/mlx#3162, #4209); the next program to ask gets EBUSY for as long as the holders
live, so waiting cannot clear it: the holders must end. A process counts as a holder when

  - it has an RDMA device file open (Linux: /dev/infiniband/uverbs*, found through
    /proc/PID/fd, since psutil lists regular files only), or
  - its environment carries JACCL's variables (MLX_IBV_DEVICES or MLX_JACCL_COORDINATOR):
    an MLX program on JACCL, ours or not. On macOS this is what finds them: no device file
    of Apple's RDMA stack is known to us (there is no /dev/infiniband, ml-explore/mlx#3777);
    docs/mac-setup.md has the manual check (`lsof -p` of a running JACCL rank) that would
    add one to DEVICE_PREFIXES.

Each holder carries the MLX_LAUNCH_ID of its environment: the orchestrator ends only
holders of its own launches, never anything else.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable
from pathlib import Path

from contract.agent_protocol import RdmaHolder
from contract.rank_env import IBV_DEVICES, JACCL_COORDINATOR, LAUNCH_ID

DEVICE_PREFIXES = ("/dev/infiniband/",)
CMDLINE_CHARS = 200


def find_holders(prefixes: Iterable[str] = DEVICE_PREFIXES) -> list[RdmaHolder]:
    """Every process (but this one) that holds, or as a JACCL program may hold, RDMA
    resources; the ones it can read (another user's processes mostly hide their env)."""
    prefixes = tuple(prefixes)
    holders = []
    for pid in _pids():
        if pid == os.getpid():
            continue
        files = [path for path in _open_paths(pid) if path.startswith(prefixes)]
        env = _environ(pid)
        jaccl = IBV_DEVICES in env or JACCL_COORDINATOR in env
        if not files and not jaccl:
            continue
        holders.append(
            RdmaHolder(
                pid=pid,
                command=_cmdline(pid)[:CMDLINE_CHARS],
                files=sorted(set(files)),
                jaccl_env=jaccl,
                launch_id=env.get(LAUNCH_ID, ""),
            )
        )
    return holders


def _pids() -> list[int]:
    try:
        import psutil

        return list(psutil.pids())
    except ImportError:
        return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def _open_paths(pid: int) -> list[str]:
    """The paths of pid's open file descriptors (device files included where the OS says)."""
    fd_dir = Path(f"/proc/{pid}/fd")
    if fd_dir.is_dir():
        paths = []
        with contextlib.suppress(OSError):
            for fd in fd_dir.iterdir():
                with contextlib.suppress(OSError):
                    paths.append(os.readlink(fd))
        return paths
    try:
        import psutil

        return [f.path for f in psutil.Process(pid).open_files()]
    except Exception:  # gone, not ours to read, or no psutil
        return []


def _environ(pid: int) -> dict[str, str]:
    try:
        import psutil

        return dict(psutil.Process(pid).environ())
    except ImportError:
        pass
    except Exception:
        return {}
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    pairs = (entry.partition(b"=") for entry in raw.split(b"\0") if entry)
    return {k.decode(errors="replace"): v.decode(errors="replace") for k, _, v in pairs}


def _cmdline(pid: int) -> str:
    try:
        import psutil

        return " ".join(psutil.Process(pid).cmdline())
    except Exception:
        with contextlib.suppress(OSError):
            return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
    return "?"
