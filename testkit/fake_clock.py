"""A monotonic clock that moves only when told to, or when something sleeps on it."""

from __future__ import annotations

import asyncio


class FakeClock:
    def __init__(self, start: float = 1000.0, real_pause_s: float = 0.0) -> None:
        self.now = start
        self.slept: list[float] = []  # every sleep asked for, in order
        # A loop that sleeps on this clock would otherwise spin the event loop (and the fake
        # time) as fast as it can while a test waits for something else.
        self.real_pause_s = real_pause_s

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds

    async def sleep(self, seconds: float) -> None:
        """Returns (at once, or after real_pause_s) with the clock moved on."""
        self.slept.append(seconds)
        self.now += seconds
        await asyncio.sleep(self.real_pause_s)
