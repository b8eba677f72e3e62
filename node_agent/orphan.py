"""An agent whose orchestrator went away: its gang serves on for orphan_grace_s.

    session ends (EOF, broken write, lease) ─▶ orphaned: the log goes to a file, the
    ranks serve, the socket waits ─┬─ an orchestrator sends Adopt or Spawn ─▶ supervised
                                   └─ orphan_grace_s passes with none ─▶ ranks end, exit

A connection that does not adopt (`status`, `down` before it stops the gang) does not
reset the clock: the grace counts from the moment the last orchestrator went away.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger("node_agent.orphan")


class OrphanGrace:
    def __init__(self, on_expire: Callable[[str], None]) -> None:
        self._on_expire = on_expire
        self.since: float | None = None  # time.time() the last orchestrator went away
        self._task: asyncio.Task[None] | None = None

    def begin(self, grace_s: float) -> None:
        """No orchestrator now: count down what is left of the grace."""
        if self.since is None:
            self.since = time.time()
        self._cancel()
        remaining = self.since + grace_s - time.time()
        self._task = asyncio.create_task(self._expire(remaining, grace_s))

    def pause(self) -> None:
        """A connection came: the clock stops while it lasts, without restarting."""
        self._cancel()

    def adopted(self) -> None:
        self.since = None
        self._cancel()

    def _cancel(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None

    async def _expire(self, remaining: float, grace_s: float) -> None:
        await asyncio.sleep(max(remaining, 0.0))
        self._on_expire(f"no orchestrator adopted the gang within {grace_s:g} s (orphan_grace_s)")


def log_to_file(path: Path) -> None:
    """Point fds 1 and 2 (the closed SSH channel's) at a file: logging goes on there."""
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
        log.info("the orchestrator went away: logging to %s", path)
