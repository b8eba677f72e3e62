"""A monotonic clock that moves only when told to, or when something sleeps on it."""

from __future__ import annotations

import asyncio


class FakeClock:
    def __init__(self, start: float = 1000.0) -> None:
        self.now = start
        self.slept: list[float] = []  # every sleep asked for, in order

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds

    async def sleep(self, seconds: float) -> None:
        """Returns at once with the clock moved on; yields so other tasks run."""
        self.slept.append(seconds)
        self.now += seconds
        await asyncio.sleep(0)
