"""How a pull shows its progress: one rich bar (bytes, rate, time left) in a terminal, or
log lines (`up`); `--json` shows nothing until its summary (pull.PullProgress)."""

from __future__ import annotations

import logging
import threading
import time

from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)

from orchestrator.models.pull import PullProgress

log = logging.getLogger("orchestrator.pull")
LOG_EVERY_S = 5.0


class RichPullProgress(PullProgress):
    def __init__(self, label: str, console: Console | None = None) -> None:
        self._label = label
        self._progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            DownloadColumn(),
            TransferSpeedColumn(),
            TimeRemainingColumn(),
            console=console or Console(stderr=True),
        )
        self._task = self._progress.add_task(label, total=None)

    def start(self, total: int, done: int) -> None:
        self._progress.update(self._task, total=total, completed=done)
        self._progress.start()

    def advance(self, n: int) -> None:  # from the download threads: rich locks
        self._progress.advance(self._task, n)

    def close(self) -> None:
        self._progress.stop()


class LogPullProgress(PullProgress):
    """For `up`: a line when the pull starts, every LOG_EVERY_S, and at the end."""

    def __init__(self, label: str) -> None:
        self._label = label
        self._lock = threading.Lock()
        self._total = self._done = self._fetched = 0
        self._started = self._logged = time.monotonic()

    def start(self, total: int, done: int) -> None:
        self._total, self._done = total, done
        self._started = self._logged = time.monotonic()
        log.info("pulling %s: %.1f MB, %.1f MB already here", self._label, total / 1e6, done / 1e6)

    def advance(self, n: int) -> None:
        with self._lock:
            self._done += n
            self._fetched += n
            now = time.monotonic()
            if now - self._logged < LOG_EVERY_S:
                return
            self._logged = now
            rate = self._fetched / max(now - self._started, 1e-6)
            left = (self._total - self._done) / rate if rate else 0.0
        log.info(
            "pulling %s: %.1f / %.1f MB, %.1f MB/s, %.0f s left",
            self._label,
            self._done / 1e6,
            self._total / 1e6,
            rate / 1e6,
            left,
        )
