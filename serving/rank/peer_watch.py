"""Exit with PEER_LOST when MLX's ring backend reports a dead peer on stderr.

In mlx <= 0.32.4, after "[ring] Too many send/recv errors. Failing pending tasks..."
the waiters of the failed collectives are never released (ml-explore/mlx#3862, fixed
upstream by #4060): a rank that was inside a step when its peer died blocks in
`mx.eval` forever instead of raising. The backend only says so on the process's C-level
stderr, so this module routes fd 2 through a pipe, copies every byte to the real
stderr, and ends the rank when a fatal line appears and the rank has not ended by
itself within a grace period. Python's own logging bypasses the pipe (sys.stderr is
pointed at the real stderr), so our log lines never depend on the relay thread.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections.abc import Callable

from contract.exit_codes import RankExit

log = logging.getLogger(__name__)

FATAL_MARKERS = (b"Too many send/recv errors", b"connection to a peer was lost")
GRACE_S = 1.0  # let the normal exception path exit first when MLX does raise
FLUSH_S = 0.2  # for the event loop to send the clients their error events


class PeerWatch:
    """Relays C-level stderr and ends the process when the ring reports a lost peer."""

    def __init__(self, grace_s: float = GRACE_S) -> None:
        self.grace_s = grace_s
        self.before_exit: Callable[[], None] | None = None  # e.g. tell in-flight clients
        self._ending = threading.Event()

    def install(self) -> None:
        real_stderr = os.dup(2)
        read_fd, write_fd = os.pipe()
        os.dup2(write_fd, 2)
        os.close(write_fd)
        sys.stderr = os.fdopen(os.dup(real_stderr), "w", buffering=1)
        thread = threading.Thread(
            target=self._relay, args=(read_fd, real_stderr), name="peer-watch", daemon=True
        )
        thread.start()

    def _relay(self, read_fd: int, real_stderr: int) -> None:
        pending = b""
        while chunk := os.read(read_fd, 65536):
            os.write(real_stderr, chunk)
            pending = (pending + chunk)[-4096:]
            if not self._ending.is_set() and any(m in pending for m in FATAL_MARKERS):
                self._ending.set()
                threading.Thread(target=self._end, name="peer-lost", daemon=True).start()

    def _end(self) -> None:
        time.sleep(self.grace_s)
        log.error("peer lost: MLX reported a failed collective and the rank did not exit "
                  "within %.1f s; exiting with %d", self.grace_s, RankExit.PEER_LOST)
        if self.before_exit is not None:
            try:
                self.before_exit()
            except Exception:
                log.exception("while failing in-flight requests")
            time.sleep(FLUSH_S)
        logging.shutdown()
        os._exit(RankExit.PEER_LOST)
