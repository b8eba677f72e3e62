"""Logging for a rank: every line carries the rank and the launch id."""

from __future__ import annotations

import logging
import sys


def setup_logging(rank: int, launch_id: str, level: str = "INFO") -> None:
    fmt = f"%(asctime)s %(levelname)s [rank {rank} launch {launch_id}] %(name)s: %(message)s"
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(fmt))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
