"""Ranks die with their agent, even when the agent is SIGKILLed.

Linux: each rank's child sets PR_SET_PDEATHSIG=SIGKILL before exec, so the
kernel kills it when the agent's thread that forked it (the event loop's, the
main thread) exits. macOS has no equivalent; see docs/architecture.md (agent protocol) for
what covers that gap (stdin EOF handling, the lease, and ranks that watch
MLX_AGENT_PID with `serving.rank.parent_watch`).
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from collections.abc import Callable

PR_SET_PDEATHSIG = 1


def pdeathsig_preexec() -> Callable[[], None] | None:
    """A preexec_fn for subprocess on Linux, None elsewhere (or without libc)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    prctl.restype = ctypes.c_int
    parent = os.getpid()
    sigkill = int(signal.SIGKILL)

    def preexec() -> None:
        # Runs in the forked child between fork and exec: no allocation-heavy work.
        prctl(PR_SET_PDEATHSIG, sigkill, 0, 0, 0)
        if os.getppid() != parent:  # the agent died before prctl took effect
            os._exit(1)

    return preexec
