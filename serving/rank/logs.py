"""Logging for a rank: every line carries the rank and the launch id."""

from __future__ import annotations

import faulthandler
import logging
import signal
import sys


def setup_logging(rank: int, launch_id: str, level: str = "INFO") -> None:
    fmt = f"%(asctime)s %(levelname)s [rank {rank} launch {launch_id}] %(name)s: %(message)s"
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(fmt))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # `kill -USR1 <pid>` prints every thread's stack: the first look at a hung rank.
    faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True)
