"""A worker's sleep between keepalives, which SIGUSR2 ends at once.

MLX's ring backend busy-polls while a collective waits, so an idle worker sleeps until just
before each keepalive instead of waiting in its next receive. A request arriving then
waited for the sleep to end (up to 0.5 s with keepalive_s = 0.5). The orchestrator's
gateway therefore has the node agents send the workers SIGUSR2 as it forwards a request
to rank 0 (agent message Wake); the signal's wakeup fd ends the sleep. A wake that comes
while the worker is busy leaves a byte behind, which ends its next sleep early: one
keepalive interval of polling, never a missed wake.
"""

from __future__ import annotations

import contextlib
import select
import signal
import socket

WAKE_SIGNAL = signal.SIGUSR2


def ignore_wakes() -> None:
    """From the rank's first line: a wake before the worker listens must not end it
    (SIGUSR2's default action is to terminate)."""
    signal.signal(WAKE_SIGNAL, signal.SIG_IGN)


class IdleSleep:
    """Main thread only (Python runs signal handlers there and owns the wakeup fd)."""

    def __init__(self) -> None:
        self._read, self._write = socket.socketpair()
        for end in (self._read, self._write):
            end.setblocking(False)
        # Every signal with a Python handler (SIGUSR2 here, SIGTERM too) writes its number
        # to this fd, which is what select() below waits on.
        signal.set_wakeup_fd(self._write.fileno(), warn_on_full_buffer=False)
        signal.signal(WAKE_SIGNAL, lambda *_: None)

    def sleep(self, seconds: float) -> None:
        """Sleep up to `seconds`, less if a signal comes."""
        select.select([self._read], [], [], seconds)
        with contextlib.suppress(BlockingIOError):
            while self._read.recv(4096):
                pass
