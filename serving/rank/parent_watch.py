"""For rank programs: exit when the node agent that started them is gone.

Linux ranks already get SIGKILL from the kernel (PR_SET_PDEATHSIG). On macOS
there is no such thing, so a rank may call `watch_agent()` once at start: a
daemon thread blocks in kqueue (NOTE_EXIT on the agent's PID, from env
rank_env.AGENT_PID) and ends the rank's whole process group when the agent exits.
No polling where kqueue exists; elsewhere it checks the parent PID every 2 s.
"""

from __future__ import annotations

import os
import select
import signal
import threading
import time

from contract.rank_env import AGENT_PID


def _wait_for_exit(pid: int) -> None:
    if hasattr(select, "kqueue"):
        kq = select.kqueue()
        # kqueue exists on macOS/BSD only; mypy checks against Linux stubs.
        event = select.kevent(  # type: ignore[attr-defined,unused-ignore]
            pid,
            filter=select.KQ_FILTER_PROC,  # type: ignore[attr-defined,unused-ignore]
            fflags=select.KQ_NOTE_EXIT,  # type: ignore[attr-defined,unused-ignore]
        )
        try:
            kq.control([event], 1, None)  # blocks until the agent exits
            return
        except ProcessLookupError:
            return  # already gone
        finally:
            kq.close()
    while os.getppid() == pid:
        time.sleep(2.0)


def _end_group() -> None:
    """Kill our process group only when we lead it (as agent-started ranks do):
    a rank started from a shell must not take the shell's job with it."""
    try:
        if os.getpgrp() == os.getpid():
            os.killpg(os.getpgrp(), signal.SIGKILL)
    finally:
        os._exit(1)


def watch_agent(pid: int | None = None) -> threading.Thread | None:
    """Start the watcher; returns None when no agent PID is known (not started by an agent)."""
    if pid is None:
        raw = os.environ.get(AGENT_PID)
        pid = int(raw) if raw and raw.isdigit() else None
    if pid is None or pid <= 1:
        return None
    agent_pid = pid

    def run() -> None:
        _wait_for_exit(agent_pid)
        _end_group()

    thread = threading.Thread(target=run, name="agent-watch", daemon=True)
    thread.start()
    return thread
