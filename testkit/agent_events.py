"""Test helpers for agents and their ranks: event capture and waiting for PIDs to go."""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from collections.abc import Callable

import psutil

from contract.agent_protocol import Event, Exited, Log

WAIT_S = 15.0


def pid_gone(pid: int) -> bool:
    """True once pid has exited (a zombie waiting for its reaper counts as gone)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


async def wait_gone(pid: int, timeout: float = WAIT_S) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pid_gone(pid):
            return True
        await asyncio.sleep(0.05)
    return pid_gone(pid)


def kill_if_alive(pid: int) -> None:
    """Test cleanup: end a process that a failing test may have left behind."""
    with contextlib.suppress(psutil.Error):
        psutil.Process(pid).kill()


class EventLog:
    """An on_event callback that records events and lets tests wait for one."""

    def __init__(self) -> None:
        self.events: list[Event] = []
        self._changed = asyncio.Event()

    def __call__(self, event: Event) -> None:
        self.events.append(event)
        self._changed.set()

    def lines(self, rank: int, stream: str | None = None) -> list[str]:
        return [
            e.line
            for e in self.events
            if isinstance(e, Log) and e.rank == rank and (stream is None or e.stream == stream)
        ]

    def exits(self, rank: int) -> list[Exited]:
        return [e for e in self.events if isinstance(e, Exited) and e.rank == rank]

    async def wait_for(self, predicate: Callable[[], bool], timeout: float = WAIT_S) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"timed out; events so far: {self.events!r}")
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), remaining)

    async def wait_exit(self, rank: int, timeout: float = WAIT_S) -> Exited:
        await self.wait_for(lambda: bool(self.exits(rank)), timeout)
        return self.exits(rank)[-1]


# A rank that prints on both streams, reports its pid and env, then sleeps.
CHATTY_RANK = [
    sys.executable,
    "-u",
    "-c",
    "import os, sys, time\n"
    "print('ready', os.getpid(), flush=True)\n"
    "print('launch', os.environ.get('MLX_LAUNCH_ID'), flush=True)\n"
    "print('warn on stderr', file=sys.stderr, flush=True)\n"
    "time.sleep(1000)\n",
]
