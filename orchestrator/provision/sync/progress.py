"""How a sync shows its progress: rich bars (a terminal), log lines (`up`), or nothing
(`--json`, which prints only the summary at the end)."""

from __future__ import annotations

import logging
import time
from typing import Protocol

from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)

log = logging.getLogger("orchestrator.sync")
LOG_EVERY_S = 5.0


class SyncProgress(Protocol):
    def start(self, node: str, total_bytes: int) -> None: ...
    def advance(self, node: str, n: int) -> None: ...
    def done(self, node: str, outcome: str) -> None: ...
    def close(self) -> None: ...


class QuietProgress:
    def start(self, node: str, total_bytes: int) -> None:
        return None

    def advance(self, node: str, n: int) -> None:
        return None

    def done(self, node: str, outcome: str) -> None:
        return None

    def close(self) -> None:
        return None


class RichProgress:
    """One bar per node being sent to: bytes, rate, time left."""

    def __init__(self, console: Console | None = None) -> None:
        self._progress = Progress(
            TextColumn("{task.description:<12}"),
            BarColumn(),
            DownloadColumn(),
            TransferSpeedColumn(),
            TimeRemainingColumn(),
            TextColumn("{task.fields[outcome]}"),
            console=console or Console(stderr=True),
            transient=False,
        )
        self._tasks: dict[str, TaskID] = {}
        self._progress.start()

    def start(self, node: str, total_bytes: int) -> None:
        self._tasks[node] = self._progress.add_task(node, total=total_bytes, outcome="")

    def advance(self, node: str, n: int) -> None:
        self._progress.advance(self._tasks[node], n)

    def done(self, node: str, outcome: str) -> None:
        if node in self._tasks:
            self._progress.update(self._tasks[node], outcome=outcome)
        else:
            self._progress.console.print(f"{node}: {outcome}")

    def close(self) -> None:
        self._progress.stop()


class LogProgress:
    """For `up`: a log line per node when it starts, every LOG_EVERY_S, and when done."""

    def __init__(self) -> None:
        self._state: dict[str, list[float]] = {}  # node: [total, sent, started, last log]

    def start(self, node: str, total_bytes: int) -> None:
        now = time.monotonic()
        self._state[node] = [total_bytes, 0, now, now]
        log.info("[%s] sending %.1f MB of the model", node, total_bytes / 1e6)

    def advance(self, node: str, n: int) -> None:
        state = self._state[node]
        state[1] += n
        now = time.monotonic()
        if now - state[3] >= LOG_EVERY_S:
            state[3] = now
            rate = state[1] / max(now - state[2], 1e-6)
            left = (state[0] - state[1]) / rate if rate else 0.0
            log.info(
                "[%s] %.1f / %.1f MB, %.1f MB/s, %.0f s left",
                node,
                state[1] / 1e6,
                state[0] / 1e6,
                rate / 1e6,
                left,
            )

    def done(self, node: str, outcome: str) -> None:
        log.info("[%s] model: %s", node, outcome)

    def close(self) -> None:
        return None
